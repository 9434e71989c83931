#ifndef PATHWAYS_EXECUTOR_WORKER_POOL_H_
#define PATHWAYS_EXECUTOR_WORKER_POOL_H_

// A pool of worker threads: the paper's executors (Figure 3, right) in one
// process. They run whatever is ready, the shards of gangs and transfers
// alike, for all devices. A device is not a thread; it is a queue in its
// island's GangScheduler. (Hosts as processes run their shards on their
// own device threads instead: host/host_executor.h.)
//
// Waking a sleeping thread on another core costs ~25 us on our VMs, more
// than a small node's whole work, so:
//  - work made ready while running a job is run next on the same thread
//    (a chain of nodes proceeds without any hand-off), and only the surplus
//    is offered to other threads;
//  - an idle worker spins for `spin_ns` before it sleeps, and a submitter
//    only pays for a wake-up when no worker is awake to take the work.
//
// Thread-safe. Jobs must not block and must not call into Python.

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "csrc/base/mutex.h"
#include "csrc/base/parallel_for.h"
#include "csrc/base/runnable.h"

namespace pw {

class WorkerPool {
 public:
  static constexpr int64_t kDefaultSpinNs = 50'000;
  // Starts `num_threads` (>= 1) workers. A kernel on one of them may split
  // its loop over `intra_op_threads` of them (0: all; 1: none).
  explicit WorkerPool(int num_threads, int64_t spin_ns = kDefaultSpinNs, int intra_op_threads = 0);
  // Stops the workers after the queue drains (see Stop()).
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues all of `list` (which is left empty). Callable from any thread,
  // including a worker.
  void Submit(ReadyList& list);
  void Submit(Runnable* job) {
    ReadyList list;
    list.Push(job);
    Submit(list);
  }

  // Lets the workers finish the queue, then joins them. Idempotent. Jobs
  // submitted afterwards stay queued and never run: the caller must make sure
  // nothing is submitted any more (the runtime stops dispatch first).
  void Stop();

  int num_threads() const { return static_cast<int>(threads_.size()); }
  // Jobs run so far (for tests and stats).
  int64_t jobs_run() const { return jobs_run_.load(std::memory_order_relaxed); }

 private:
  void WorkerLoop();
  // Takes one job from the shared queue, or nullptr.
  Runnable* TryTake();

  const int64_t spin_ns_;
  // Lets a kernel on one worker split its loop over the others
  // (base/parallel_for.h); its helpers are submitted to this pool.
  ParallelTeam team_;
  std::atomic<bool> has_work_{false};  // queue_ is nonempty; read without the lock
  std::atomic<int64_t> jobs_run_{0};
  Mutex mu_;
  CondVar work_cv_;
  // Protects the shared queue, the sleeper count and the stop flag.
  ReadyList queue_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pw

#endif  // PATHWAYS_EXECUTOR_WORKER_POOL_H_
