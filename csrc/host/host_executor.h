#ifndef PATHWAYS_HOST_HOST_EXECUTOR_H_
#define PATHWAYS_HOST_HOST_EXECUTOR_H_

// What a host process runs (paper §4, Figure 3): its shards of every gang the
// client dispatches to it, its shards of the buffers those gangs use, and the
// transfers between its devices and other hosts'.
//
// Order. The client sends every host its work in one global order (the
// order in which it dispatched), so every device queue here holds its gangs
// in the island's order, as the gang scheduler of §4.4 wants. A gang's local
// part starts when it is at the head of each of its local devices' queues and
// its local inputs are ready. A gang that spans hosts meets its other hosts
// in its collectives, over Gloo (CollectiveGroup, one group per set of
// hosts). Since every host takes gangs in the same order, and a gang's part
// runs on a thread of its own device (a running part owns its devices, so
// running parts never outnumber the device threads), a part waiting in a
// collective never holds a thread an earlier gang needs. A part that cannot
// run still makes its gang's first collective, carrying a "cannot run" flag
// that makes every host of the gang stop after it (RunPart).
//
// Data. A transfer moves each shard from the host of its source device to the
// host of its destination device: a copy inside a host, else one message on
// the data plane (coordination/data_plane.h: authenticated TCP, a connection
// per pair of hosts) from host to host, never through the client, straight
// from the source buffer into the destination. Each host has one sending and
// one receiving thread per peer. Sends go in the global order. A message
// names its run (program id, first buffer id) and its destination buffer,
// and the receiving thread takes each into the receive posted for that
// buffer: pairing by id, not by order, so a host that refused a run (its
// peers queued their side of it) shifts no later transfer into the wrong
// buffer. A message whose receive is not posted yet waits for it (its run
// has not reached this host yet: every host takes runs in the same order);
// one for a run this host refused or cancelled is read and dropped. A source
// that failed sends its error instead, which fails the destination.
//
// Refusals and cancellation. A run this host cannot start (a program it
// could not load, a malformed binding, a run the client cancelled before it
// came) is refused as a whole: Run's reply is the error, nothing is made,
// and the run is remembered as dead here (its messages are dropped). The
// other hosts of the run started their parts, which can then never complete
// as they should: a receive waits for a message the refuser never sends, a
// cross-host gang for a host that never joins. The client, on the refusal's
// reply, cancels the run on its hosts (CancelRun, naming the refuser):
// parts not started fail with the refusal's error without running, receives
// pending for it fail, its later messages are dropped, and its sends carry
// the error instead of the data. A cancelled cross-host gang whose hosts
// include the refuser enters none of its collectives (the refuser never
// would); one whose hosts do not joins its first collective without running
// (RunPart), so that a host of it whose part started before the cancel came
// is told to stop there rather than wait. A part that had already started
// (met its gang, Arrive) when the cancel came waits for the refuser until
// the arrival timeout.
//
// Loads. A failed DefineDevices, LoadFunction or LoadProgram replies with its
// error and leaves the error here under its id: a later load or run that
// names the id fails with it ("function 3 could not be loaded on host 1:
// ..."), not with "no such id". A refused Put chunk fails its buffer.
//
// Thread-safe. Requests come from the control plane (HostRuntime).

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/collective_group.h"
#include "csrc/coordination/data_plane.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/kernels/function_executable.h"

namespace pw {

// This host's shards of one sharded buffer, contiguous in list order; also
// the future of whatever produces them here.
class HostBuffer {
 public:
  HostBuffer(uint64_t id, int64_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint64_t id() const { return id_; }
  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  // False if its memory could not be allocated (then it is never written),
  // and once it has failed (its memory is given back then).
  bool allocated() const { return data_ != nullptr; }
  absl::Status AllocationError() const;

  // Calls `fn` with the status once the buffer is done: at once, on this
  // thread, if it is done already. `fn` must not block.
  void OnDone(absl::AnyInvocable<void(const absl::Status&) &&> fn);
  bool done() const;
  // Done with an error.
  bool failed() const;
  // Waits until done or `stopping` is set; the status (Cancelled if stopped).
  absl::Status Await(const std::atomic<bool>& stopping);
  // Completes the buffer (once).
  void Complete(const absl::Status& status);

 private:
  const uint64_t id_;
  const int64_t bytes_;
  uint8_t* data_ = nullptr;
  mutable Mutex mu_;
  CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>> waiters_ ABSL_GUARDED_BY(mu_);
};

struct HostSetGroups;  // host_executor.cc

// A device list as this host sees it.
struct HostDeviceList {
  std::vector<int> device_ids;      // global ids, in list order
  std::vector<int> hosts;           // host of each position
  std::vector<int> local_positions; // positions on this host, increasing
  std::vector<int> local_devices;   // their index in this host's devices
  // The hosts of the list, increasing, and each one's positions.
  std::vector<int> host_set;
  std::vector<std::vector<int>> positions_by_host;  // parallel to host_set
  std::optional<LocalShards> local;  // when this host holds some positions
  // The collective groups of its host set, when it has positions here and
  // on other hosts (owned by the executor).
  HostSetGroups* groups = nullptr;
  bool all_local() const { return local_positions.size() == device_ids.size(); }
};

// Where the hosts of a collective group meet (CollectiveGroup::Create's
// rendezvous): in the store kept by the group's lowest host, so that making
// a group needs only its own members alive (with one store on host 0, a
// lost host 0 would keep every other island from making new groups).
class RendezvousStores {
 public:
  virtual ~RendezvousStores() = default;
  // The store kept by `host`; it lives as long as this object. Unavailable
  // if that host cannot be reached. Thread-safe; may block while it
  // connects (bounded).
  virtual absl::StatusOr<KeyValueStore*> StoreOf(int host) = 0;
  // The store where the group of `members` (host ids, increasing) meets,
  // for one rendezvous (it must outlive only that): the one kept by its
  // lowest member. An implementation that learns of lost hosts ends its
  // waits at once (Unavailable) when a member is lost, so a group with a
  // lost member fails to form at once instead of after its timeout. The
  // default: StoreOf(members.front()) as it is.
  virtual absl::StatusOr<std::unique_ptr<KeyValueStore>> GroupStore(absl::Span<const int> members);
};

// One store for every host: hosts as threads of one process (tests).
class SharedRendezvous final : public RendezvousStores {
 public:
  explicit SharedRendezvous(KeyValueStore* store) : store_(store) {}
  absl::StatusOr<KeyValueStore*> StoreOf(int) override { return store_; }

 private:
  KeyValueStore* const store_;
};

class HostExecutor {
 public:
  // `stores` are where this host meets the others to connect its collective
  // groups; they must outlive the executor. `bind_ip`: the address the data
  // plane (and Gloo) binds and advertises to the other hosts. `secret`: the
  // cluster's, which every data plane connection must prove it knows
  // (empty: the cluster's group prefix stands in, for tests), or with the
  // join's peer keys, the key of the pair of hosts.
  HostExecutor(const wire::HostConfig& config, const wire::JoinCluster& join, RendezvousStores* stores,
               std::string bind_ip = "127.0.0.1", std::string secret = "");
  // Stops the threads. Work still queued is dropped.
  ~HostExecutor();
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  // Connects the data plane to every other host (blocks until they all
  // have joined, or fails after the collective timeout); the hosts find
  // each other's addresses in host 0's rendezvous store.
  absl::Status ConnectDataPlane();

  // Loads: OK, or why not (also kept under the id, see "Loads" above).
  absl::Status DefineDevices(const wire::DefineDevices& request);
  absl::Status LoadFunction(const wire::LoadFunction& request);
  absl::Status LoadProgram(const wire::LoadProgram& request);
  // One chunk of a buffer. An error also fails the buffer here (made, failed,
  // if this was its first chunk), so its readers and runs get it; its later
  // chunks are dropped.
  absl::Status Put(wire::PutBuffer& request);
  // Starts a run; `done` gets the reply once this host's part has finished,
  // or at once, with the error, if this host refuses the run (see
  // "Refusals" above: the run is then dead here).
  void Run(const wire::RunProgram& request, absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> done);
  // Cancels a run here (wire::CancelRun; see "Refusals and cancellation"):
  // with `request.status()` as every failure's error. Idempotent; a run not
  // seen yet is refused when it comes. Returns at once: pending receives and
  // queued parts fail on this call's thread or their own.
  void CancelRun(const wire::CancelRun& request);
  // Gets a range of this host's shards of a buffer once it is done.
  void Fetch(const wire::FetchBuffer& request, absl::AnyInvocable<void(absl::StatusOr<std::string>) &&> done);
  void Free(const wire::FreeBuffers& request);
  // Forgets functions and programs the client dropped (and why a load of
  // them failed). Runs under way keep what they use; an id not loaded here
  // is ignored (the client sends each host only what it loaded there).
  void Unload(const wire::Unload& request);
  // Fault injection: marks these devices (all of this host's: else
  // InvalidArgument, and none is marked) failed for good. Parts on them
  // that have not started fail without running, parts in their simulated
  // time stop and fail, and transfers from or to them fail, all with
  // Unavailable naming the device.
  absl::Status FailDevices(const wire::FailDevices& request);

  // These other hosts were lost (the client told this host): transfers
  // with them, in flight or queued, fail at once (their data plane
  // connections are shut down), and a group with one of them never forms
  // (its rendezvous gives up at once: RendezvousStores::GroupStore), and
  // their collective groups break (AbortGroupsWith): a part waiting for one
  // of them to arrive stops at once. Parts of gangs with them fail through
  // those. InvalidArgument for a host that
  // is not another host of the cluster (nothing is done then).
  absl::Status PeersLost(const wire::PeersLost& request);
  // Whether this host was told that `host` was lost.
  bool PeerLost(int host) const;

  // What the device queues hold now (pw.diagnose).
  wire::QueuesReply DescribeQueues();

  // Cancels parts that have not started (a client closed, or shutting
  // down): those of the runs `which` matches, by (program id, first buffer
  // id), fail with Cancelled ("'f' in program 'p' was cancelled: <reason>")
  // when their turn comes, without running kernels or simulated time, and
  // so do their outputs; a part of a gang that meets other hosts still makes
  // the gang's first collective (RunPart), so its other hosts stop too.
  // Parts running finish; with `end_simulated_time`, those of them in their
  // simulated time end it now (their results stand). Returns how many parts
  // it cancelled. `which` is called under the queues' lock: it must not
  // block.
  int CancelParts(absl::FunctionRef<bool(uint64_t program_id, uint64_t first_buffer_id)> which,
                  absl::string_view reason, bool end_simulated_time);
  // wire::CancelRuns, through CancelParts.
  wire::CancelRunsReply CancelRuns(const wire::CancelRuns& request);

  // The gangs across exactly `hosts` (increasing, this host among them) of
  // runs started after this call meet in a fresh incarnation of their
  // collective group; those started before keep theirs (wire::RenewGroup).
  // Every host of the set must get it at the same place among the runs.
  // An incarnation is dropped once a newer one exists and no part of its
  // own is left. InvalidArgument for a set that is not one.
  absl::Status RenewGroup(absl::Span<const int> hosts);

  // `host` is lost for good (-1: every host; this one is stopping): every
  // collective group it belongs to breaks, so parts waiting for it to
  // arrive, or making a group with it, fail now with `why`, and so does
  // every later gang across it. Parts inside a collective proper end at
  // their timeout, or at once if the host's process died (its connections
  // close). Whoever learns of a lost host tells the others through this.
  void AbortGroupsWith(int host, const absl::Status& why);

  // The collective timeouts (before any run; the defaults suit
  // production): `timeout` bounds every collective operation once the
  // gang's hosts have all arrived; `arrival_timeout` bounds how long a part
  // waits for the other hosts' parts of its gang to arrive (in its first
  // collective, and in making its group), however busy their devices are.
  // A zero duration keeps that timeout as it is.
  void SetCollectiveTimeouts(absl::Duration timeout, absl::Duration arrival_timeout);

  // Buffers held now (tests).
  int num_buffers() const;
  // Functions and programs loaded now, failed loads included (tests).
  int num_functions() const;
  int num_programs() const;

 private:
  struct Program;
  struct Function;
  struct Part;
  struct RunState;
  struct Peer;
  class GroupCollectives;

  // A run as the hosts name it: the client session (0: the one client of
  // today; several clients would each get theirs), the program, and the
  // run's first buffer id (unique per run within a session).
  struct RunKey {
    uint64_t session = 0;
    uint64_t program_id = 0;
    uint64_t first_buffer_id = 0;
    friend bool operator==(const RunKey&, const RunKey&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const RunKey& k) {
      return H::combine(std::move(h), k.session, k.program_id, k.first_buffer_id);
    }
  };
  // The session of every run today: the one client that configured this
  // host. Several clients on one set of hosts would each get theirs (from
  // their control session), and the ids they choose would count per session.
  static constexpr uint64_t kOneSession = 0;
  // Where a receive is posted: the session and the destination buffer.
  using RecvKey = std::pair<uint64_t, uint64_t>;

  // OK unless the run is dead here (refused or cancelled): then why. One
  // atomic load while no run ever was.
  absl::Status DeadStatus(const RunKey& run) const;
  // Whether one of `hosts` refused the dead run (it will join none of the
  // run's collectives).
  bool RefusedByAnyOf(const RunKey& run, absl::Span<const int> hosts) const;
  // Marks the run dead with `why` (the first reason stays) and `refuser`
  // (-1: none known) among the hosts that refused it; false if it was dead
  // already. Wakes the receiving threads, which drop its messages from now
  // on.
  bool MarkDead(const RunKey& run, const absl::Status& why, int refuser);
  // A receiving thread for every other host, so that whatever a peer sends
  // for a run this host refused is read and dropped, not left on the wire.
  void EnsureReceivers();
  // The receives from `peer` fail with `status`, and every later one at
  // once (its connection broke, or the host is stopping).
  void FailReceives(Peer* peer, const absl::Status& status);

  absl::StatusOr<const HostDeviceList*> List(int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<HostBuffer> NewBuffer(uint64_t id, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets buffer `id`, moving it to `dropped` (to free unlocked).
  void DropLocked(uint64_t id, std::vector<std::shared_ptr<HostBuffer>>& dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transfer of one step or argument of `run`: `src` and `dst` are this
  // host's buffers, null where it holds no shard; `dst_id` the destination's
  // id (what its messages name).
  void StartTransfer(const RunKey& run, const HostDeviceList& src_list, std::shared_ptr<HostBuffer> src,
                     const HostDeviceList& dst_list, uint64_t dst_id, std::shared_ptr<HostBuffer> dst,
                     int64_t shard_bytes);
  // The loads' checks and work; the callers keep their errors.
  absl::Status DefineDevicesChecked(const wire::DefineDevices& request);
  absl::Status LoadProgramLocked(const wire::LoadProgram& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Put's checks and copy; the caller fails the buffer on an error.
  absl::Status PutLocked(wire::PutBuffer& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Internal if a part's inputs have other sizes than its function takes
  // (a client's mistake, never a read past a buffer); ResourceExhausted if
  // an output could not be allocated.
  absl::Status CheckSizes(const Part& part) const;
  absl::Status CheckTransferSizes(const HostBuffer& src, int64_t src_bytes, const HostBuffer& dst) const;
  // Unavailable naming the first failed device among `local_devices`
  // (indices in this host's devices), else OK. One atomic load while no
  // device has failed.
  absl::Status CheckHealthy(absl::Span<const int> local_devices) const;
  // HostLost naming a host of `gang` this host was told was lost, else OK.
  // One atomic load while no peer was lost.
  absl::Status CheckPeers(const HostDeviceList& gang) const;
  void Enqueue(Part* part);
  void CountDown(Part* part);
  void DeviceLoop(int device);
  class Scratch;
  // Runs `part`'s kernels unless `status` says it cannot run; `status` ends
  // as the part's result. A cross-host gang whose function calls collectives
  // agrees in its first collective whether every host's part runs (see
  // GroupCollectives); one that calls none runs or fails on each host alone.
  // A part of a cancelled run whose gang includes a host that refused it
  // (`refused_in_gang`) joins no collective: that host never would.
  void RunPart(const Part& part, absl::Status& status, bool refused_in_gang, Scratch& scratch);
  // The incarnation `generation` of the collective group of `list`'s hosts
  // (made at its first use).
  absl::StatusOr<std::shared_ptr<CollectiveGroup>> GroupFor(const HostDeviceList& list, uint64_t generation);
  // Whether `part` meets other hosts in collectives (then it counts in its
  // group generation's parts from Enqueue until it has run).
  static bool MeetsOtherHosts(const Part& part);
  // `part` (which MeetsOtherHosts) has run: its generation counts it no more.
  void LeaveGeneration(const Part& part);
  Peer& PeerFor(int host);
  void SendLoop(Peer* peer);
  void RecvLoop(Peer* peer);

  const int host_id_;
  const int num_local_devices_;
  std::vector<int> device_host_;            // by global device id
  std::vector<int> local_index_;            // by global device id: index in this host, or -1
  std::vector<int> local_device_ids_;       // by index in this host: global id
  const std::string group_prefix_;
  RendezvousStores* const stores_;
  const std::string secret_;
  // This host's row of peer keys from the join (auth.h), by host id; empty
  // if the client gave none (tests): the data plane then uses the secret.
  const std::vector<std::string> peer_keys_;
  CollectiveOptions collective_options_;
  // How long a gang's part waits for its other hosts' parts to arrive
  // (CollectiveGroup::Arrive, and making its group): long, since a peer may
  // be busy with earlier gangs on its devices. A peer that dies closes its
  // connections, which ends the wait at once; one known to be lost ends it
  // through AbortGroupsWith.
  absl::Duration arrival_timeout_ = absl::Hours(1);
  std::atomic<bool> stopping_{false};
  const int island_id_;
  // Failed local devices (FailDevices), by index in this host; fail_cv_
  // wakes parts in their simulated time when one fails.
  std::unique_ptr<std::atomic<bool>[]> failed_;
  std::atomic<bool> any_failed_{false};
  Mutex fail_mu_;
  CondVar fail_cv_;
  // Hosts this host was told were lost (PeersLost), by host id.
  std::unique_ptr<std::atomic<bool>[]> lost_peers_;
  std::atomic<bool> any_peer_lost_{false};
  int num_hosts_ = 0;

  mutable Mutex mu_;  // the tables below
  absl::flat_hash_map<int, std::unique_ptr<HostDeviceList>> lists_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<const Function>> functions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<const Program>> programs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<HostBuffer>> buffers_ ABSL_GUARDED_BY(mu_);
  // Buffers being put in chunks: where the next chunk goes.
  absl::flat_hash_map<uint64_t, int64_t> puts_in_progress_ ABSL_GUARDED_BY(mu_);
  // Why a load failed, by id (erased if a later load of the id works).
  absl::flat_hash_map<int, absl::Status> list_errors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> function_errors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> program_errors_ ABSL_GUARDED_BY(mu_);

  // Dead runs: refused here or cancelled by the client, and why; the last
  // kMaxDeadRuns of them (a message for a run forgotten since would wait for
  // its receive: the set is large enough that none is still on its way).
  // Locked after a peer's mu.
  static constexpr size_t kMaxDeadRuns = size_t{1} << 16;
  struct DeadRun {
    absl::Status why;
    std::vector<int> refusers;  // hosts that refused it, as the client said
  };
  mutable Mutex dead_mu_;
  absl::flat_hash_map<RunKey, DeadRun> dead_runs_ ABSL_GUARDED_BY(dead_mu_);
  std::deque<RunKey> dead_order_ ABSL_GUARDED_BY(dead_mu_);  // oldest first
  std::atomic<bool> any_dead_{false};

  // Device queues: the gang parts in order, per local device; a part counts
  // one down per device as it reaches the head.
  Mutex queue_mu_;
  std::vector<std::deque<Part*>> queues_ ABSL_GUARDED_BY(queue_mu_);
  // Parts ready to run, per local device (the part's first local device).
  struct Worker {
    Mutex mu;
    CondVar cv;
    std::deque<Part*> ready ABSL_GUARDED_BY(mu);
    std::thread thread;
  };
  std::vector<std::unique_ptr<Worker>> workers_;

  // The collective groups of each set of hosts that shares a gang, by the
  // set ("0,1"): entries are made by DefineDevices and never removed, so
  // lists point to them.
  Mutex groups_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<HostSetGroups>> groups_ ABSL_GUARDED_BY(groups_mu_);
  std::unique_ptr<DataPlane> data_;  // set by ConnectDataPlane, before any transfer

  Mutex peers_mu_;
  absl::flat_hash_map<int, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(peers_mu_);
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_EXECUTOR_H_
