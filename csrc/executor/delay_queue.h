#ifndef PATHWAYS_EXECUTOR_DELAY_QUEUE_H_
#define PATHWAYS_EXECUTOR_DELAY_QUEUE_H_

// Runs jobs at given times: how a simulated kernel of known duration keeps
// its devices busy without burning a CPU core. A gang whose function has
// simulated_compute ops runs its real kernels, then asks for its completion
// at start + duration; the devices stay occupied (the gang stays at the head
// of their queues) until then.
//
// One thread sleeps until shortly before the earliest deadline and spins the
// rest of the way (a wake-up costs ~25-50 us here, longer than the precision
// a 0.33 ms kernel needs). At a deadline it runs the job, and then whatever
// that made ready, itself: the next gang on the freed devices starts without
// a hand-off to another thread, so back-to-back simulated kernels leave no
// gap on the device beyond a few microseconds.
//
// Thread-safe.

#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "csrc/base/mutex.h"
#include "csrc/base/runnable.h"

namespace pw {

class DelayQueue {
 public:
  DelayQueue();
  // Runs the jobs still pending (early), then stops the thread.
  ~DelayQueue();
  DelayQueue(const DelayQueue&) = delete;
  DelayQueue& operator=(const DelayQueue&) = delete;

  // Runs `job` on the delay thread at `deadline_ns` (NowNanos() clock).
  void RunAt(int64_t deadline_ns, Runnable* job);

  // From now on every deadline counts as passed: pending and later jobs run
  // as soon as the thread gets to them (for cancelling simulated work at
  // shutdown). Irreversible.
  void Hurry();
  // A job for which `due(job)` is true is due at once: checked when the job
  // is added (RunAt) and, for jobs already pending, by ApplyHurryRule(). For
  // failing work early (a gang on a failed device). Set once, before use.
  void SetHurryRule(std::function<bool(Runnable*)> due);
  // Makes the pending jobs the rule now finds due, due at once; call after
  // the rule's answer may have changed. O(pending jobs). Race-free with
  // RunAt: both check the rule under the queue's lock, so a job added while
  // the answer changes is caught by one of them.
  void ApplyHurryRule();
  // Runs the jobs still pending (early), then joins the thread. Idempotent;
  // jobs added afterwards never run.
  void Stop();

 private:
  struct Entry {
    int64_t deadline_ns;
    uint64_t order;  // FIFO among equal deadlines
    Runnable* job;
    bool operator>(const Entry& o) const {
      return deadline_ns != o.deadline_ns ? deadline_ns > o.deadline_ns : order > o.order;
    }
  };
  void Loop();

  Mutex mu_;
  CondVar cv_;
  // Protects the heap of pending jobs, its insertion counter and the stop and
  // hurry flags.
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool hurry_ ABSL_GUARDED_BY(mu_) = false;
  std::function<bool(Runnable*)> hurry_rule_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pw

#endif  // PATHWAYS_EXECUTOR_DELAY_QUEUE_H_
