#include "csrc/executor/worker_pool.h"

#include <algorithm>

#include "csrc/base/spin.h"

namespace pw {

WorkerPool::WorkerPool(int num_threads, int64_t spin_ns, int intra_op_threads)
    : spin_ns_(spin_ns),
      team_([this](Runnable* r) { Submit(r); },
            (intra_op_threads > 0 ? std::min(intra_op_threads, std::max(num_threads, 1))
                                  : std::max(num_threads, 1)) - 1) {
  if (num_threads < 1) num_threads = 1;
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkerPool::Submit(ReadyList& list) {
  if (list.empty()) return;
  MutexLock lock(&mu_);
  queue_.Splice(list);
  has_work_.store(true, std::memory_order_release);
  // Spinning workers will see has_work_; only a sleeper needs the wake-up.
  if (sleepers_ > 0) work_cv_.Signal();
}

Runnable* WorkerPool::TryTake() {
  if (!has_work_.load(std::memory_order_acquire)) return nullptr;
  MutexLock lock(&mu_);
  Runnable* job = queue_.Pop();
  has_work_.store(!queue_.empty(), std::memory_order_release);
  return job;
}

void WorkerPool::WorkerLoop() {
  std::vector<uint8_t> scratch;
  ReadyList local;
  RunContext ctx{&local, &scratch};
  SetCurrentParallelTeam(&team_);
  while (true) {
    Runnable* job = local.Pop();
    if (job == nullptr) job = TryTake();
    if (job == nullptr && SpinUntil([this] { return has_work_.load(std::memory_order_relaxed); }, spin_ns_)) {
      job = TryTake();
    }
    if (job == nullptr) {
      MutexLock lock(&mu_);
      if (queue_.empty()) {
        if (stop_) return;
        ++sleepers_;
        work_cv_.Wait(&mu_);
        --sleepers_;
      }
      continue;
    }
    job->Run(ctx);
    jobs_run_.fetch_add(1, std::memory_order_relaxed);
    // Keep the first newly ready job for this thread; offer the rest.
    if (local.head != nullptr && local.head != local.tail) {
      Runnable* mine = local.Pop();
      Submit(local);
      local.Push(mine);
    }
  }
}

}  // namespace pw
