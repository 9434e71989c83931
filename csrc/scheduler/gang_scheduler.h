#ifndef PATHWAYS_SCHEDULER_GANG_SCHEDULER_H_
#define PATHWAYS_SCHEDULER_GANG_SCHEDULER_H_

// The gang scheduler (paper §4.4): one per island. It gives every
// multi-device computation (a Gang) one position in a single island-wide
// order, across all programs and clients, and each device runs its gangs in
// that order: a gang starts only when every earlier gang that shares one of
// its devices has finished.
//
// Why that cannot deadlock: consider the earliest-ordered unfinished gang G.
// Every earlier gang on G's devices has finished, so G may start; its inputs
// come from gangs ordered before it (admission checks this), which have
// finished or will, by the same argument. So some gang can always make
// progress, however many clients share the devices and however their slices
// overlap.
//
// The rule itself (a gang starts once it heads each of its devices'
// queues) is GangOrder's (gang_order.h), which each host's executor also
// runs by: per gang, O(number of device lists overlapping its own), never
// O(devices).
//
// Policies:
//  - FIFO: a gang is ordered when it is submitted.
//  - Proportional share: gangs wait in per-client queues and are admitted
//    into the order by start-time fair queueing on their estimated device
//    time divided by the client's weight, keeping only a short window of
//    admitted gangs per device set, so each backlogged client gets device
//    time in proportion to its weight. A gang is admitted only after the
//    producers of its inputs, so the order stays consistent with dataflow.
//
// Diagnosis (diagnosis.h): Snapshot() describes the gangs that are not
// running, under the lock, on demand; the dispatch path only stamps each gang
// with its submission time.
//
// Thread-safe. Gangs must stay alive from Enqueue() until Complete() returns.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/container/flat_hash_map.h"
#include "csrc/base/mutex.h"
#include "csrc/base/runnable.h"
#include "csrc/cluster/device_list.h"
#include "csrc/object_store/object_store.h"
#include "csrc/scheduler/diagnosis.h"
#include "csrc/scheduler/fair_queue.h"
#include "csrc/scheduler/gang_order.h"

namespace pw {

enum class SchedulingPolicy : uint8_t { kFifo, kProportionalShare };
// "fifo" or "proportional_share"; InvalidArgument naming the choices.
absl::string_view SchedulingPolicyName(SchedulingPolicy policy);
absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view name);

// A tenant of the islands: the unit of proportional share and of device-time
// accounting. Thread-safe; must outlive the gangs that name it.
class SchedulingClient {
 public:
  SchedulingClient(int id, std::string name, double weight)
      : id_(id), name_(std::move(name)), weight_(weight), memory_(name_) {}
  int id() const { return id_; }
  const std::string& name() const { return name_; }
  double weight() const { return weight_; }
  // Clients of one process share a priority (FairQueue); a service's
  // tenants have their own (service/service.h).
  int priority() const { return 0; }

  // The client's ownership label (§4.6): what its buffers hold.
  MemoryAccount& memory() { return memory_; }
  const MemoryAccount& memory() const { return memory_; }

  // A closed client dispatches nothing more; its gangs that have not
  // started run cancelled. For good.
  void Close() { closed_.store(true, std::memory_order_release); }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // Device time used: each gang adds its duration times its device count
  // (on host processes, each host its part's: `gangs` is 1 for one of them).
  void AddUsage(int64_t device_ns, int64_t gangs = 1) {
    device_ns_.fetch_add(device_ns, std::memory_order_relaxed);
    gangs_.fetch_add(gangs, std::memory_order_relaxed);
  }
  int64_t device_ns() const { return device_ns_.load(std::memory_order_relaxed); }
  int64_t gangs() const { return gangs_.load(std::memory_order_relaxed); }

 private:
  const int id_;
  const std::string name_;
  const double weight_;
  std::atomic<int64_t> device_ns_{0};
  std::atomic<int64_t> gangs_{0};
  MemoryAccount memory_;
  std::atomic<bool> closed_{false};
};

// Device time per shard assumed for proportional share when a function has
// no simulated compute (its real kernels are tiny in comparison).
inline constexpr int64_t kNominalKernelNs = 1000;

// Admitted-but-unfinished gangs allowed on a set of overlapping device lists
// under proportional share: one running and a couple queued keeps devices
// busy while leaving the order to the fair-queueing tags.
inline constexpr int kAdmissionWindow = 3;

// The name of the client of gangs that name none.
const std::string& DefaultClientName();

class GangScheduler;

// A computation over a list of devices of one island, gang-scheduled.
class Gang : public Runnable {
 public:
  // `client` may be null (the default client); `cost_ns` estimates the
  // device time of one shard (used by proportional share).
  Gang(const DeviceList* devices, SchedulingClient* client, int64_t cost_ns)
      : devices_(devices), client_(client), cost_ns_(cost_ns) {}
  const DeviceList* gang_devices() const { return devices_; }
  SchedulingClient* client() const { return client_; }
  // Position in the island order (valid once admitted).
  uint64_t sequence() const { return sequence_; }
  // Whether the gang has its place in the order yet (thread-safe).
  bool sequenced() const { return sequenced_.load(std::memory_order_acquire); }

 protected:
  // Called exactly once, when the gang is at the head of every one of its
  // devices' queues, on the thread that made it so (the submitter or an
  // executor). Must not block; puts work that becomes ready into `ready`.
  virtual void OnAtHeadOfAllQueues(ReadyList* ready) = 0;
  // Whether every input is done or produced by a gang already in this
  // island's order (see ShardedBuffer::IsSequencedOn). Called with the
  // scheduler's lock held; must not block.
  virtual bool InputsSequenced() const { return true; }
  // Called when the gang is given its place in the order (lock held).
  virtual void OnSequenced() {}

  // For diagnosis only (GangScheduler::Snapshot), with the scheduler's lock
  // held while the gang is queued; must not block.
  // The program and the node (compiled function) it runs, or null; valid
  // while the gang is queued.
  virtual const std::string* program_name() const { return nullptr; }
  virtual const std::string* node_name() const { return nullptr; }
  // How many inputs are not ready yet; appends them to `out` unless null.
  virtual int PendingInputs(std::vector<PendingInput>* out) const { return 0; }
  // Appends the identities of its outputs (as in PendingInput::buffer).
  virtual void AppendOutputs(std::vector<const void*>* out) const {}

 private:
  friend class GangScheduler;
  const DeviceList* devices_;
  SchedulingClient* client_;
  int64_t cost_ns_;
  uint64_t sequence_ = 0;
  int64_t submission_ = 0;
  int64_t submitted_ns_ = 0;  // NowNanos() at Enqueue()
  std::atomic<bool> sequenced_{false};
  bool notified_ = false;       // guarded by the scheduler's mutex
  bool hang_reported_ = false;  // guarded by the scheduler's mutex
};

class GangScheduler {
 public:
  explicit GangScheduler(const Island* island);
  ~GangScheduler();
  GangScheduler(const GangScheduler&) = delete;
  GangScheduler& operator=(const GangScheduler&) = delete;

  const Island* island() const { return island_; }

  // Submits `gang` (all its devices must belong to this island). Under FIFO
  // it is ordered at once; under proportional share when admitted.
  void Enqueue(Gang* gang, ReadyList* ready);

  // Removes the finished `gang` (which was at the head of all its queues),
  // which kept its devices busy for `busy_ns`; gangs that thereby reach the
  // head of all their queues are notified, and waiting gangs may be admitted.
  void Complete(Gang* gang, ReadyList* ready, int64_t busy_ns = 0);

  // Adds `busy_ns` to the busy time of `devices` (of this island): work the
  // hosts ran for gangs this scheduler did not run (hosts as processes).
  void AddBusy(const DeviceList* devices, int64_t busy_ns);

  // Busy time of each device of the island so far, by index in the island
  // (the sum of busy_ns of the gangs that ran on it).
  std::vector<int64_t> DeviceBusyNs() const;

  // Retries admitting waiting gangs: called when an input of a waiting gang
  // completed, which may make it admissible (an input from another island
  // counts only once done, and nothing else on this island may be running).
  void RetryAdmission(ReadyList* ready);

  // Switching to FIFO admits every waiting gang, in fair-queueing order.
  void SetPolicy(SchedulingPolicy policy, ReadyList* ready);
  SchedulingPolicy policy() const;

  // Gangs ordered so far (the next sequence number).
  uint64_t num_enqueued() const;
  // Gangs submitted but not yet completed (waiting or ordered).
  int64_t num_in_flight() const;
  // Gangs submitted so far; each gang's submission number is its rank.
  int64_t num_submitted() const;
  // The smallest submission number among gangs not yet completed, or
  // num_submitted() if none. Scans the queues: for waits, not the hot path.
  int64_t MinSubmissionInFlight() const;

  // Appends this island's counts and its gangs that are not running to
  // `out` (see Diagnose() in diagnosis.h for `min_wait_ns` and `take`),
  // without their inputs' producers. Under the lock: work per gang in
  // flight; which devices each blocker heads is worked out after it.
  void Snapshot(int64_t min_wait_ns, bool take, Diagnosis* out);
  // Names the producer of each input of `gangs` whose awaited buffer a gang
  // in flight on this island produces.
  void FindProducers(std::vector<WaitingGang>* gangs) const;

 private:
  using ListId = GangOrder<Gang*>::ListId;
  // The list of `devices` in the order (made at its first use).
  ListId ListForLocked(const DeviceList* devices) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SequenceLocked(Gang* gang, ListId list, ReadyList* notify) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmitWaitingLocked(ReadyList* notify, bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasRoomLocked(ListId list) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GangState StateLocked(const Gang* gang) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GangRef RefLocked(const Gang* gang) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Island* island_;
  mutable Mutex mu_;
  // Protects everything below: the island order (its per-list queues of
  // ordered gangs), the per-client queues of gangs waiting for admission
  // with their fair-queueing tags, and each gang's notified_ flag.
  SchedulingPolicy policy_ ABSL_GUARDED_BY(mu_) = SchedulingPolicy::kFifo;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  GangOrder<Gang*> order_ ABSL_GUARDED_BY(mu_);  // devices: their index in the island
  absl::flat_hash_map<const DeviceList*, ListId> lists_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> busy_ns_ ABSL_GUARDED_BY(mu_);  // by list: summed over the gangs that ran there
  FairQueue<Gang*> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_SCHEDULER_GANG_SCHEDULER_H_
