#include "csrc/scheduler/gang_scheduler.h"

#include <cassert>

namespace pw {

GangScheduler::GangScheduler(const Island* island) : island_(island), queues_(island->devices().size()) {}

void GangScheduler::Enqueue(Gang* gang, ReadyList* ready) {
  bool at_head;
  {
    MutexLock lock(&mu_);
    gang->sequence_ = next_sequence_++;
    ++in_flight_;
    int missing = 0;
    for (Device* d : gang->devices_->devices()) {
      assert(d->island() == island_);
      std::deque<Gang*>& q = queues_[d->index_in_island()];
      q.push_back(gang);
      if (q.size() > 1) ++missing;
    }
    gang->heads_missing_ = missing;
    at_head = missing == 0;
  }
  if (at_head) gang->OnAtHeadOfAllQueues(ready);
}

void GangScheduler::Complete(Gang* gang, ReadyList* ready) {
  // Gangs that reach the head of all their queues; notified outside the lock.
  absl::InlinedVector<Gang*, 8> now_at_head;
  {
    MutexLock lock(&mu_);
    --in_flight_;
    for (Device* d : gang->devices_->devices()) {
      std::deque<Gang*>& q = queues_[d->index_in_island()];
      assert(!q.empty() && q.front() == gang);
      q.pop_front();
      if (!q.empty()) {
        Gang* next = q.front();
        if (--next->heads_missing_ == 0) now_at_head.push_back(next);
      }
    }
  }
  for (Gang* g : now_at_head) g->OnAtHeadOfAllQueues(ready);
}

uint64_t GangScheduler::num_enqueued() const {
  MutexLock lock(&mu_);
  return next_sequence_;
}

int64_t GangScheduler::num_in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace pw
