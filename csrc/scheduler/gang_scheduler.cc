#include "csrc/scheduler/gang_scheduler.h"

#include <algorithm>

#include "csrc/base/check.h"

namespace pw {
namespace {
// Admitted-but-unfinished gangs allowed on a set of overlapping device lists
// under proportional share: one running and a couple queued keeps devices
// busy while leaving the order to the fair-queueing tags.
constexpr size_t kAdmissionWindow = 3;
}  // namespace

struct GangScheduler::ListQueue {
  const DeviceList* devices = nullptr;
  std::deque<Gang*> ordered;         // admitted gangs on exactly these devices, in order
  std::vector<ListQueue*> overlaps;  // other lists sharing a device with this one
  int64_t busy_ns = 0;               // summed over the gangs that ran here
};

struct GangScheduler::ClientQueue {
  const SchedulingClient* client = nullptr;
  std::deque<Gang*> waiting;
  double finish_tag = 0;
};

GangScheduler::GangScheduler(const Island* island) : island_(island) {}
GangScheduler::~GangScheduler() = default;

GangScheduler::ListQueue* GangScheduler::QueueForLocked(const DeviceList* devices) {
  auto it = lists_.find(devices);
  if (it != lists_.end()) return it->second.get();
  auto q = std::make_unique<ListQueue>();
  q->devices = devices;
  // The overlap graph is built once per new device list: O(devices) here,
  // never per gang.
  std::vector<uint8_t> mine(island_->devices().size(), 0);
  for (Device* d : devices->devices()) {
    PW_DCHECK(d->island() == island_, "a device list of a gang lies on its scheduler's island");
    mine[d->index_in_island()] = 1;
  }
  for (ListQueue* other : all_lists_) {
    for (Device* d : other->devices->devices()) {
      if (mine[d->index_in_island()]) {
        other->overlaps.push_back(q.get());
        q->overlaps.push_back(other);
        break;
      }
    }
  }
  ListQueue* result = q.get();
  all_lists_.push_back(result);
  lists_.emplace(devices, std::move(q));
  return result;
}

void GangScheduler::MaybeNotifyLocked(Gang* gang, ListQueue* q, ReadyList* notify) {
  if (gang->notified_ || q->ordered.front() != gang) return;
  for (const ListQueue* other : q->overlaps) {
    if (!other->ordered.empty() && other->ordered.front()->sequence_ < gang->sequence_) return;
  }
  gang->notified_ = true;
  notify->Push(gang);  // the gang itself, as a marker; see Enqueue/Complete
}

void GangScheduler::SequenceLocked(Gang* gang, ListQueue* q, ReadyList* notify) {
  gang->sequence_ = next_sequence_++;
  gang->sequenced_.store(true, std::memory_order_release);
  gang->OnSequenced();
  q->ordered.push_back(gang);
  MaybeNotifyLocked(gang, q, notify);
}

bool GangScheduler::HasRoomLocked(const ListQueue* q) const {
  size_t ordered = q->ordered.size();
  for (const ListQueue* other : q->overlaps) ordered += other->ordered.size();
  return ordered < kAdmissionWindow;
}

void GangScheduler::AdmitWaitingLocked(ReadyList* notify, bool all) {
  while (waiting_ > 0) {
    // The admissible head with the smallest start tag (start-time fair
    // queueing); clients are few, so a scan is cheapest.
    ClientQueue* best = nullptr;
    double best_start = 0;
    for (auto& [client, cq] : clients_) {
      if (cq->waiting.empty()) continue;
      Gang* head = cq->waiting.front();
      if (!head->InputsSequenced()) continue;
      if (!all && !HasRoomLocked(QueueForLocked(head->devices_))) continue;
      const double start = std::max(virtual_time_, cq->finish_tag);
      if (best == nullptr || start < best_start) {
        best = cq.get();
        best_start = start;
      }
    }
    if (best == nullptr) return;
    Gang* gang = best->waiting.front();
    best->waiting.pop_front();
    --waiting_;
    const double weight = gang->client_ ? std::max(gang->client_->weight(), 1e-9) : 1.0;
    virtual_time_ = best_start;
    best->finish_tag = best_start + static_cast<double>(gang->cost_ns_) * gang->devices_->size() / weight;
    SequenceLocked(gang, QueueForLocked(gang->devices_), notify);
  }
}

void GangScheduler::Enqueue(Gang* gang, ReadyList* ready) {
  ReadyList notify;
  {
    MutexLock lock(&mu_);
    ++in_flight_;
    gang->submission_ = submitted_++;
    // Under FIFO a gang is ordered at once, unless gangs still wait from a
    // proportional-share period: then it queues behind its client's earlier
    // gangs, which may produce its inputs.
    if (policy_ == SchedulingPolicy::kFifo && waiting_ == 0) {
      SequenceLocked(gang, QueueForLocked(gang->devices_), &notify);
    } else {
      std::unique_ptr<ClientQueue>& cq = clients_[gang->client_];
      if (cq == nullptr) {
        cq = std::make_unique<ClientQueue>();
        cq->client = gang->client_;
        cq->finish_tag = virtual_time_;
      }
      cq->waiting.push_back(gang);
      ++waiting_;
      AdmitWaitingLocked(&notify, /*all=*/policy_ == SchedulingPolicy::kFifo);
    }
  }
  // Notify outside the lock: a gang's callback may run arbitrary bookkeeping.
  while (Runnable* r = notify.Pop()) static_cast<Gang*>(r)->OnAtHeadOfAllQueues(ready);
}

void GangScheduler::Complete(Gang* gang, ReadyList* ready, int64_t busy_ns) {
  ReadyList notify;
  {
    MutexLock lock(&mu_);
    --in_flight_;
    ListQueue* q = lists_.at(gang->devices_).get();
    q->busy_ns += busy_ns;
    PW_DCHECK(!q->ordered.empty() && q->ordered.front() == gang,
              "only the gang at the head of its list's queue runs, so it is the one completing");
    q->ordered.pop_front();
    if (!q->ordered.empty()) MaybeNotifyLocked(q->ordered.front(), q, &notify);
    for (ListQueue* other : q->overlaps) {
      if (!other->ordered.empty()) MaybeNotifyLocked(other->ordered.front(), other, &notify);
    }
    if (waiting_ > 0) AdmitWaitingLocked(&notify, policy_ == SchedulingPolicy::kFifo);
  }
  while (Runnable* r = notify.Pop()) static_cast<Gang*>(r)->OnAtHeadOfAllQueues(ready);
}

void GangScheduler::RetryAdmission(ReadyList* ready) {
  ReadyList notify;
  {
    MutexLock lock(&mu_);
    if (waiting_ > 0) AdmitWaitingLocked(&notify, policy_ == SchedulingPolicy::kFifo);
  }
  while (Runnable* r = notify.Pop()) static_cast<Gang*>(r)->OnAtHeadOfAllQueues(ready);
}

void GangScheduler::SetPolicy(SchedulingPolicy policy, ReadyList* ready) {
  ReadyList notify;
  {
    MutexLock lock(&mu_);
    policy_ = policy;
    if (policy == SchedulingPolicy::kFifo) AdmitWaitingLocked(&notify, /*all=*/true);
  }
  while (Runnable* r = notify.Pop()) static_cast<Gang*>(r)->OnAtHeadOfAllQueues(ready);
}

SchedulingPolicy GangScheduler::policy() const {
  MutexLock lock(&mu_);
  return policy_;
}

std::vector<int64_t> GangScheduler::DeviceBusyNs() const {
  MutexLock lock(&mu_);
  std::vector<int64_t> busy(island_->devices().size(), 0);
  for (const ListQueue* q : all_lists_) {
    for (Device* d : q->devices->devices()) busy[d->index_in_island()] += q->busy_ns;
  }
  return busy;
}

uint64_t GangScheduler::num_enqueued() const {
  MutexLock lock(&mu_);
  return next_sequence_;
}

int64_t GangScheduler::num_submitted() const {
  MutexLock lock(&mu_);
  return submitted_;
}

int64_t GangScheduler::MinSubmissionInFlight() const {
  MutexLock lock(&mu_);
  int64_t min = submitted_;
  for (const ListQueue* q : all_lists_) {
    for (const Gang* g : q->ordered) min = std::min(min, g->submission_);
  }
  for (const auto& [client, cq] : clients_) {
    for (const Gang* g : cq->waiting) min = std::min(min, g->submission_);
  }
  return min;
}

int64_t GangScheduler::num_in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace pw
