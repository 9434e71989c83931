#ifndef PATHWAYS_SCHEDULER_GANG_SCHEDULER_H_
#define PATHWAYS_SCHEDULER_GANG_SCHEDULER_H_

// The gang scheduler (paper §4.4): one per island. It gives every
// multi-device computation (a Gang) one position in a single island-wide
// order, across all programs and client threads, and appends it to the
// in-order queue of each of its devices under one lock. Each device's queue
// is therefore a subsequence of the island order, and a gang starts only when
// it is at the head of all its devices' queues.
//
// Why that cannot deadlock: consider the earliest-ordered unfinished gang G.
// On each of G's devices every earlier gang has finished, so G is at the
// head of all its queues; its inputs come from gangs dispatched (hence
// ordered) before it, which have finished or will, by the same argument.
// So some gang can always make progress, however many clients share the
// devices and however their slices overlap.
//
// The policy is FIFO: gangs are ordered as they are submitted.
//
// Thread-safe. Gangs must stay alive from Enqueue() until Complete() returns.

#include <cstdint>
#include <deque>
#include <vector>

#include "csrc/base/mutex.h"
#include "csrc/base/runnable.h"
#include "csrc/cluster/device_list.h"

namespace pw {

class GangScheduler;

// A computation over a list of devices of one island, gang-scheduled.
class Gang : public Runnable {
 public:
  explicit Gang(const DeviceList* devices) : devices_(devices) {}
  const DeviceList* gang_devices() const { return devices_; }
  // Position in the island order (valid after Enqueue).
  uint64_t sequence() const { return sequence_; }

 protected:
  // Called exactly once, when the gang is at the head of every one of its
  // devices' queues, on the thread that made it so (the submitter or an
  // executor). Must not block; puts work that becomes ready into `ready`.
  virtual void OnAtHeadOfAllQueues(ReadyList* ready) = 0;

 private:
  friend class GangScheduler;
  const DeviceList* devices_;
  uint64_t sequence_ = 0;
  int heads_missing_ = 0;  // guarded by the scheduler's mutex
};

class GangScheduler {
 public:
  explicit GangScheduler(const Island* island);
  GangScheduler(const GangScheduler&) = delete;
  GangScheduler& operator=(const GangScheduler&) = delete;

  const Island* island() const { return island_; }

  // Orders `gang` after every gang enqueued before it on this island and
  // appends it to its devices' queues. Every device of the gang must belong
  // to this island.
  void Enqueue(Gang* gang, ReadyList* ready);

  // Removes the finished `gang` (at the head of all its queues) from its
  // devices' queues; gangs that thereby reach the head of all their queues
  // are notified.
  void Complete(Gang* gang, ReadyList* ready);

  // Gangs ordered so far (the next sequence number).
  uint64_t num_enqueued() const;
  // Gangs enqueued but not yet completed.
  int64_t num_in_flight() const;

 private:
  const Island* island_;
  mutable Mutex mu_;
  // Protects the island order counter and every device queue; a gang's
  // heads_missing_ is only touched under it.
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::deque<Gang*>> queues_ ABSL_GUARDED_BY(mu_);  // by Device::index_in_island()
};

}  // namespace pw

#endif  // PATHWAYS_SCHEDULER_GANG_SCHEDULER_H_
