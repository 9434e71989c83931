#include "csrc/scheduler/gang_scheduler.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "csrc/base/check.h"
#include "csrc/base/spin.h"

namespace pw {

absl::string_view SchedulingPolicyName(SchedulingPolicy policy) {
  return policy == SchedulingPolicy::kFifo ? "fifo" : "proportional_share";
}

absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view name) {
  if (name == "fifo") return SchedulingPolicy::kFifo;
  if (name == "proportional_share") return SchedulingPolicy::kProportionalShare;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown scheduling policy '", name, "': expected 'fifo' or 'proportional_share'"));
}

const std::string& DefaultClientName() {
  static const std::string* const name = new std::string("default");
  return *name;
}

GangScheduler::GangScheduler(const Island* island)
    : island_(island), order_(static_cast<int>(island->devices().size())) {}
GangScheduler::~GangScheduler() = default;

GangScheduler::ListId GangScheduler::ListForLocked(const DeviceList* devices) {
  auto it = lists_.find(devices);
  if (it != lists_.end()) return it->second;
  std::vector<int> indices;
  indices.reserve(devices->devices().size());
  for (Device* d : devices->devices()) {
    PW_DCHECK(d->island() == island_, "a device list of a gang lies on its scheduler's island");
    indices.push_back(d->index_in_island());
  }
  const ListId id = order_.ListOf(indices);  // O(devices) once per new list, never per gang
  if (static_cast<size_t>(id) >= busy_ns_.size()) busy_ns_.resize(id + 1, 0);
  lists_.emplace(devices, id);
  return id;
}

void GangScheduler::SequenceLocked(Gang* gang, ListId list, ReadyList* notify) {
  gang->sequence_ = order_.num_ordered();
  gang->sequenced_.store(true, std::memory_order_release);
  gang->OnSequenced();
  order_.Append(list, gang, [&](Gang* g) {
    g->notified_ = true;
    notify->Push(g);
  });
}

bool GangScheduler::HasRoomLocked(ListId list) const {
  return order_.OrderedAround(list) < static_cast<size_t>(kAdmissionWindow);
}

void GangScheduler::AdmitWaitingLocked(ReadyList* notify, bool all) {
  // The admissible head with the smallest start tag (fair_queue.h); a head
  // is admissible once its inputs' producers are ordered, and (unless
  // `all`) while its devices' window has room.
  auto admissible = [&](Gang* head) {
    mu_.AssertHeld();
    return head->InputsSequenced() && (all || HasRoomLocked(ListForLocked(head->devices_)));
  };
  auto cost = [](Gang* gang) { return static_cast<double>(gang->cost_ns_) * gang->devices_->size(); };
  while (std::optional<Gang*> gang = waiting_.Pop(/*fair=*/true, admissible, cost)) {
    SequenceLocked(*gang, ListForLocked((*gang)->devices_), notify);
  }
}

void GangScheduler::Enqueue(Gang* gang, ReadyList* ready) {
  ReadyList notify;
  gang->submitted_ns_ = NowNanos();
  {
    MutexLock lock(&mu_);
    ++in_flight_;
    gang->submission_ = submitted_++;
    // Under FIFO a gang is ordered at once, unless gangs still wait from a
    // proportional-share period: then it queues behind its client's earlier
    // gangs, which may produce its inputs.
    if (policy_ == SchedulingPolicy::kFifo && waiting_.empty()) {
      SequenceLocked(gang, ListForLocked(gang->devices_), &notify);
    } else {
      waiting_.Push(gang->client_, gang);
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
    const ListId list = lists_.at(gang->devices_);
    busy_ns_[list] += busy_ns;
    PW_DCHECK(!order_.list(list).ordered.empty() && order_.list(list).ordered.front().gang == gang,
              "only the gang at the head of its list's queue runs, so it is the one completing");
    order_.PopFront(list, [&](Gang* g) {
      g->notified_ = true;
      notify.Push(g);
    });
    if (!waiting_.empty()) AdmitWaitingLocked(&notify, policy_ == SchedulingPolicy::kFifo);
  }
  while (Runnable* r = notify.Pop()) static_cast<Gang*>(r)->OnAtHeadOfAllQueues(ready);
}

void GangScheduler::RetryAdmission(ReadyList* ready) {
  ReadyList notify;
  {
    MutexLock lock(&mu_);
    if (!waiting_.empty()) AdmitWaitingLocked(&notify, policy_ == SchedulingPolicy::kFifo);
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

void GangScheduler::AddBusy(const DeviceList* devices, int64_t busy_ns) {
  MutexLock lock(&mu_);
  busy_ns_[ListForLocked(devices)] += busy_ns;
}

std::vector<int64_t> GangScheduler::DeviceBusyNs() const {
  MutexLock lock(&mu_);
  std::vector<int64_t> busy(island_->devices().size(), 0);
  for (ListId list = 0; list < order_.num_lists(); ++list) {
    for (int d : order_.list(list).devices) busy[d] += busy_ns_[list];
  }
  return busy;
}

uint64_t GangScheduler::num_enqueued() const {
  MutexLock lock(&mu_);
  return order_.num_ordered();
}

int64_t GangScheduler::num_submitted() const {
  MutexLock lock(&mu_);
  return submitted_;
}

int64_t GangScheduler::MinSubmissionInFlight() const {
  MutexLock lock(&mu_);
  int64_t min = submitted_;
  order_.ForEach([&](const GangOrder<Gang*>::Ordered& o, ListId) { min = std::min(min, o.gang->submission_); });
  waiting_.ForEach([&](const Gang* g) { min = std::min(min, g->submission_); });
  return min;
}

GangState GangScheduler::StateLocked(const Gang* gang) const {
  if (!gang->sequenced_.load(std::memory_order_relaxed)) return GangState::kWaitingForAdmission;
  if (!gang->notified_) return GangState::kQueued;
  return gang->PendingInputs(nullptr) > 0 ? GangState::kHoldingDevices : GangState::kRunning;
}

GangRef GangScheduler::RefLocked(const Gang* gang) const {
  GangRef ref;
  ref.island = island_->id();
  ref.id = gang->submission_;
  if (const std::string* program = gang->program_name()) ref.program = *program;
  if (const std::string* node = gang->node_name()) ref.node = *node;
  ref.client = gang->client_ != nullptr ? gang->client_->name() : DefaultClientName();
  ref.devices = gang->devices_;
  ref.state = StateLocked(gang);
  return ref;
}

void GangScheduler::Snapshot(int64_t min_wait_ns, bool take, Diagnosis* out) {
  // A waiting gang, and the fronts of the device lists that overlap its own
  // with their place in the order: the candidates for heading the queues of
  // its devices (parallel to report.blocked_by until resolved below).
  struct Waiter {
    WaitingGang report;
    uint64_t sequence = std::numeric_limits<uint64_t>::max();  // not ordered: after every front
    // The devices of each front's list (fixed once made: read unlocked).
    std::vector<std::pair<const std::vector<int>*, uint64_t>> fronts;
  };
  std::vector<Waiter> waiters;
  IslandCounts counts;
  counts.island = island_->id();
  {
    MutexLock lock(&mu_);
    const int64_t now = NowNanos();
    absl::flat_hash_map<const Gang*, GangRef> refs;  // each front named once
    auto add = [&](Gang* gang, GangState state, ListId list) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const int64_t waited = std::max<int64_t>(0, now - gang->submitted_ns_);
      if (waited < min_wait_ns || (take && gang->hang_reported_)) return;
      if (take) gang->hang_reported_ = true;
      if (list < 0) list = ListForLocked(gang->devices_);  // not admitted: its list may be new
      Waiter& w = waiters.emplace_back();
      w.report.gang = RefLocked(gang);
      w.report.gang.state = state;
      w.report.waited_ns = waited;
      gang->PendingInputs(&w.report.inputs);
      if (state != GangState::kWaitingForAdmission) w.sequence = gang->sequence_;
      auto consider = [&](ListId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const GangOrder<Gang*>::List& other = order_.list(id);
        if (other.ordered.empty()) return;
        const Gang* front = other.ordered.front().gang;
        if (front == gang || front->sequence_ > w.sequence) return;
        auto [it, inserted] = refs.try_emplace(front);
        if (inserted) it->second = RefLocked(front);
        w.report.blocked_by.push_back(QueueHead{it->second, {}});
        w.fronts.emplace_back(&other.devices, front->sequence_);
      };
      consider(list);
      for (ListId other : order_.list(list).overlaps) consider(other);
    };
    order_.ForEach([&](const GangOrder<Gang*>::Ordered& o, ListId list) {
      mu_.AssertHeld();
      const GangState state = StateLocked(o.gang);
      if (state == GangState::kRunning) {
        ++counts.running;
      } else {
        add(o.gang, state, list);
      }
    });
    waiting_.ForEach([&](Gang* gang) {
      mu_.AssertHeld();
      add(gang, GangState::kWaitingForAdmission, -1);
    });
    counts.queued = in_flight_ - counts.running;
    counts.waiting_for_admission = waiting_.size();
  }
  out->islands.push_back(counts);
  // Each device's queue is headed by the earliest-ordered front of the lists
  // holding it (the waiting gang's own list included); a candidate that heads
  // none of the waiting gang's devices is dropped.
  for (Waiter& w : waiters) {
    const DeviceList* mine = w.report.gang.devices;
    // By the device's index in the island: sequence, candidate (-1: itself).
    absl::flat_hash_map<int, std::pair<uint64_t, int>> head;
    for (const Device* d : mine->devices()) head[d->index_in_island()] = {w.sequence, -1};
    for (size_t i = 0; i < w.fronts.size(); ++i) {
      for (int d : *w.fronts[i].first) {
        auto it = head.find(d);
        if (it != head.end() && w.fronts[i].second < it->second.first) it->second = {w.fronts[i].second, static_cast<int>(i)};
      }
    }
    for (const Device* d : mine->devices()) {
      if (const int i = head[d->index_in_island()].second; i >= 0) w.report.blocked_by[i].device_ids.push_back(d->id());
    }
    std::erase_if(w.report.blocked_by, [](const QueueHead& h) { return h.device_ids.empty(); });
    out->waiting.push_back(std::move(w.report));
  }
}

void GangScheduler::FindProducers(std::vector<WaitingGang>* gangs) const {
  absl::flat_hash_map<const void*, std::vector<PendingInput*>> wanted;
  for (WaitingGang& g : *gangs) {
    for (PendingInput& in : g.inputs) {
      if (!in.producer.has_value() && in.awaited() != nullptr) wanted[in.awaited()].push_back(&in);
    }
  }
  if (wanted.empty()) return;
  MutexLock lock(&mu_);
  std::vector<const void*> outputs;
  auto check = [&](const Gang* gang) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    outputs.clear();
    gang->AppendOutputs(&outputs);
    for (const void* output : outputs) {
      auto it = wanted.find(output);
      if (it == wanted.end()) continue;
      const GangRef ref = RefLocked(gang);
      for (PendingInput* in : it->second) in->producer = ref;
    }
  };
  order_.ForEach([&](const GangOrder<Gang*>::Ordered& o, ListId) {
    mu_.AssertHeld();
    check(o.gang);
  });
  waiting_.ForEach([&](const Gang* gang) {
    mu_.AssertHeld();
    check(gang);
  });
}

int64_t GangScheduler::num_in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace pw
