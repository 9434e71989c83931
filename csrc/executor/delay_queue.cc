#include "csrc/executor/delay_queue.h"

#include "csrc/base/spin.h"

namespace pw {
namespace {
// Sleep until this long before a deadline, then spin.
constexpr int64_t kSpinWindowNs = 150'000;
}  // namespace

DelayQueue::DelayQueue() : thread_([this] { Loop(); }) {}

DelayQueue::~DelayQueue() { Stop(); }

void DelayQueue::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void DelayQueue::SetHurryRule(std::function<bool(Runnable*)> due) {
  MutexLock lock(&mu_);
  hurry_rule_ = std::move(due);
}

void DelayQueue::ApplyHurryRule() {
  MutexLock lock(&mu_);
  if (!hurry_rule_) return;
  std::vector<Entry> entries;
  entries.reserve(heap_.size());
  while (!heap_.empty()) {
    entries.push_back(heap_.top());
    heap_.pop();
  }
  bool any = false;
  for (Entry& e : entries) {
    if (hurry_rule_(e.job)) {
      e.deadline_ns = 0;  // keeps its insertion order among the hurried
      any = true;
    }
    heap_.push(e);
  }
  if (any) cv_.Signal();
}

void DelayQueue::Hurry() {
  MutexLock lock(&mu_);
  hurry_ = true;
  cv_.Signal();
}

void DelayQueue::RunAt(int64_t deadline_ns, Runnable* job) {
  MutexLock lock(&mu_);
  if (hurry_rule_ && hurry_rule_(job)) deadline_ns = 0;
  const bool earliest = heap_.empty() || deadline_ns < heap_.top().deadline_ns;
  heap_.push(Entry{deadline_ns, next_order_++, job});
  if (earliest) cv_.Signal();
}

void DelayQueue::Loop() {
  std::vector<uint8_t> scratch;
  ReadyList ready;
  RunContext ctx{&ready, &scratch};
  while (true) {
    Runnable* job = nullptr;
    {
      MutexLock lock(&mu_);
      while (job == nullptr) {
        if (heap_.empty()) {
          if (stop_) return;
          cv_.Wait(&mu_);
          continue;
        }
        const int64_t deadline = heap_.top().deadline_ns;
        const int64_t now = NowNanos();
        if (now >= deadline || stop_ || hurry_) {
          job = heap_.top().job;
          heap_.pop();
        } else if (deadline - now > kSpinWindowNs) {
          cv_.WaitUntil(&mu_, std::chrono::steady_clock::time_point(
                                  std::chrono::nanoseconds(deadline - kSpinWindowNs)));
        } else {
          mu_.Unlock();
          SpinUntil([&] { return NowNanos() >= deadline; }, deadline - now);
          mu_.Lock();
        }
      }
    }
    job->Run(ctx);
    // Run what that made ready here too (see the header): typically the next
    // gang on the same devices, which schedules its own completion.
    while (Runnable* next = ready.Pop()) next->Run(ctx);
  }
}

}  // namespace pw
