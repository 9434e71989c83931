#include "csrc/scheduler/hang_watchdog.h"

#include <algorithm>
#include <chrono>

namespace pw {

HangWatchdog::HangWatchdog(Source source, int64_t threshold_ns)
    : source_(std::move(source)), threshold_ns_(threshold_ns), thread_([this] { Loop(); }) {}

HangWatchdog::HangWatchdog(std::vector<GangScheduler*> schedulers, int64_t threshold_ns)
    : HangWatchdog([schedulers = std::move(schedulers)](
                       int64_t threshold) { return Diagnose(schedulers, threshold, /*take=*/true); },
                   threshold_ns) {}

HangWatchdog::~HangWatchdog() { Stop(); }

void HangWatchdog::Stop() {
  MutexLock join(&join_mu_);
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void HangWatchdog::Loop() {
  const auto period = std::chrono::nanoseconds(std::clamp<int64_t>(threshold_ns_ / 4, 10'000'000, 1'000'000'000));
  while (true) {
    {
      MutexLock lock(&mu_);
      const auto deadline = std::chrono::steady_clock::now() + period;
      while (!stop_ && cv_.WaitUntil(&mu_, deadline)) {
      }
      if (stop_) return;
    }
    Diagnosis report = source_(threshold_ns_);
    if (report.waiting.empty()) continue;
    MutexLock lock(&mu_);
    if (queue_.size() >= kMaxQueuedReports) {
      ++dropped_;
      continue;
    }
    queue_.push_back(std::move(report));
    num_queued_.fetch_add(1, std::memory_order_relaxed);
  }
}

std::optional<Diagnosis> HangWatchdog::TakeReport() {
  MutexLock lock(&mu_);
  if (queue_.empty()) return std::nullopt;
  Diagnosis report = std::move(queue_.front());
  queue_.pop_front();
  num_queued_.fetch_sub(1, std::memory_order_relaxed);
  return report;
}

int64_t HangWatchdog::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace pw
