#ifndef PATHWAYS_HOST_HOST_EXECUTOR_H_
#define PATHWAYS_HOST_HOST_EXECUTOR_H_

// A host process's scheduler, the paper's per-host executor (§4, Figure 3):
// it runs this host's shards of every gang the client dispatches to it, in
// the client's order, one thread per device, and holds its shards of the
// buffers those gangs use and the transfers between its devices and other
// hosts'. (Not the in-process WorkerPool, executor/worker_pool.h; the
// control plane's end in the process is HostProcess, host_process.h.)
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
// names its run (session, program id, first buffer id) and its destination
// buffer, and the receiving thread takes each into the receive posted for
// that buffer: pairing by id, not by order, so a host that refused a run
// (its peers queued their side of it) shifts no later transfer into the
// wrong buffer. A message whose receive is not posted yet waits for it (its run
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
// is told to stop there rather than wait. A part whose gang has the refuser
// and that had already started (it waits for the refuser, making their
// group or in Arrive) when the cancel came stops waiting (Part::
// stop_meeting), leaving the group usable.
//
// Loads. A failed DefineDevices, LoadFunction or LoadProgram replies with its
// error and leaves the error here under its id: a later load or run that
// names the id fails with it ("function 3 could not be loaded on host 1:
// ..."), not with "no such id". A refused Put chunk fails its buffer.
//
// Its parts, each with one job and a lock of its own (this class owns them,
// runs the device queues and the loads, and passes each request to the
// part it is for):
//   HostBuffers (host_buffers.h)     the buffers, by id, and the puts;
//   HostTransfers (host_transfers.h) the data plane: sends, receives, copies;
//   HostGroups (host_groups.h)       the collective groups per set of hosts;
//   HostHealth (host_health.h)       failed devices and lost peers;
//   DeadRuns (host_runs.h)           the runs refused or cancelled here;
// and HostLayout (host_layout.h), what this host is in its cluster, fixed.
//
// Ids. Every id a request names (device lists, functions, programs,
// buffers, gang tags) is its client session's (SessionId, host_runs.h):
// each request takes the session, and two sessions may use one id for
// different things without meeting. Keyed by session: the loads' tables
// here and what failed to load (SessionKey), HostBuffers' store and its
// puts, HostGroups' sets (each session's gangs meet in groups of their own,
// since gang tags and meetings are unique only per session), runs (RunKey:
// dead runs, cancels, a part's run) and the data plane's messages and posted
// receives. The session is the host's owner's (kOneSession) or, when a
// service (pathways-server) owns the host, one of its tenants': the
// service gives each tenant an id, the same on every host, and its requests
// carry it (wire::Request::session; HostProcess passes it here). The
// service also sends every tenant's runs to all hosts in one order (see
// "Order": two sessions' gangs sent to two hosts in different orders could
// wait for each other).
//
// Sessions that end. A tenant that goes is ended on every host
// (EndSession): whatever of it is queued is cancelled, what runs finishes,
// and then nothing of it is left here, so a host serving tenants that come
// and go holds only what the living ones made.
//
// Thread-safe. Requests come from the control plane (HostProcess). Lock
// order: the loads' tables (mu_), then the buffer store's (a run finds and
// makes its buffers under both), then a buffer's; the queues' (queue_mu_),
// then a buffer's (DescribeQueues). A device's worker lock and the
// sessions' counts (sessions_mu_) are leaves. A buffer's waiters run on the
// thread that completes it, under whatever that thread holds (see
// HostBuffers).

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/host/host_buffers.h"
#include "csrc/host/host_groups.h"
#include "csrc/host/host_health.h"
#include "csrc/host/host_layout.h"
#include "csrc/host/host_runs.h"
#include "csrc/host/host_transfers.h"
#include "csrc/kernels/function_executable.h"
#include "csrc/scheduler/gang_order.h"

namespace pw {

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
  // each other's addresses in host 0's rendezvous store. A process that
  // replaces a lost host (the join's data_addresses) connects to the hosts
  // alive now, at the addresses the join gives.
  absl::Status ConnectDataPlane();
  // Where this host's data plane listens, once connected (JoinClusterReply).
  std::string data_address() const { return transfers_.address(); }

  // The client's requests. Each names ids of `session`, the client's (see
  // "Ids" above): another session's are not seen.
  //
  // Loads: OK, or why not (also kept under the id, see "Loads" above).
  absl::Status DefineDevices(const wire::DefineDevices& request, SessionId session = kOneSession);
  absl::Status LoadFunction(const wire::LoadFunction& request, SessionId session = kOneSession);
  absl::Status LoadProgram(const wire::LoadProgram& request, SessionId session = kOneSession);
  // One chunk of a buffer. An error also fails the buffer here (made, failed,
  // if this was its first chunk), so its readers and runs get it; its later
  // chunks are dropped.
  absl::Status Put(wire::PutBuffer& request, SessionId session = kOneSession);
  // Starts a run; `done` gets the reply once this host's part has finished,
  // or at once, with the error, if this host refuses the run (see
  // "Refusals" above: the run is then dead here).
  void Run(const wire::RunProgram& request, absl::AnyInvocable<void(absl::StatusOr<wire::RunReply>) &&> done,
           SessionId session = kOneSession);
  // Cancels a run here (wire::CancelRun; see "Refusals and cancellation"):
  // with `request.status()` as every failure's error. Idempotent; a run not
  // seen yet is refused when it comes. Returns at once: pending receives and
  // queued parts fail on this call's thread or their own.
  void CancelRun(const wire::CancelRun& request, SessionId session = kOneSession);
  // Gets a range of this host's shards of a buffer once it is done.
  void Fetch(const wire::FetchBuffer& request, absl::AnyInvocable<void(absl::StatusOr<std::string>) &&> done,
             SessionId session = kOneSession);
  void Free(const wire::FreeBuffers& request, SessionId session = kOneSession);
  // Writes this host's shards of the buffers into a checkpoint's database
  // (wire::SaveShards), once they are done, with the process's shard
  // writer (shard_writer.h) on the storage thread; `done` gets its status.
  // Unimplemented without a writer; a buffer's error, NotFound for an
  // unknown one, or the writer's error otherwise.
  void SaveShards(const wire::SaveShards& request, absl::AnyInvocable<void(absl::Status) &&> done,
                  SessionId session = kOneSession);
  // Makes the buffers of a checkpoint's restore (wire::LoadShards) here at
  // once, pending (later requests that use them wait for them, as for a
  // put), then has the process's shard reader (shard_reader.h) read this
  // host's shards of each into its memory on the storage thread, and
  // completes them; `done` gets the status, which every buffer of the
  // request also gets. Unimplemented without a reader; an unknown device
  // list's error, ResourceExhausted for memory, or the reader's error
  // otherwise (each naming this host).
  void LoadShards(const wire::LoadShards& request, absl::AnyInvocable<void(absl::Status) &&> done,
                  SessionId session = kOneSession);
  // Forgets functions and programs the client dropped (and why a load of
  // them failed). Runs under way keep what they use; an id not loaded here
  // is ignored (the client sends each host only what it loaded there).
  void Unload(const wire::Unload& request, SessionId session = kOneSession);
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
  // A new process took lost host `host`'s place (wire::PeerJoined; the
  // rendezvous store's part is the caller's, PeerStores::Rejoin). In two
  // steps. PeerJoined, on the thread that takes the client's requests in
  // order: the host is not lost any more, and the groups of sets with it
  // start over under its new `epoch` (HostGroups::PeerJoined); does not
  // block. ConnectPeer, on a thread of the caller's: reads the new
  // process's data plane address from its store and connects the data
  // plane with it, proving `key` (HostTransfers::RejoinPeer); blocks,
  // bounded by the collective timeout. InvalidArgument for a host that is
  // not another host of the cluster.
  absl::Status PeerJoined(int host, int epoch);
  absl::Status ConnectPeer(int host, const std::string& key);

  // What the device queues hold now (pw.diagnose), as `session` may see it:
  // the parts of other sessions' runs hold their places without their ids.
  wire::QueuesReply DescribeQueues(SessionId session = kOneSession);

  // Cancels parts that have not started (a client closed, or shutting
  // down): those of the runs `which` matches, by RunKey (session, program
  // id, first buffer id), fail with Cancelled ("'f' in program 'p' was
  // cancelled: <reason>") when their turn comes, without running kernels or
  // simulated time, and so do their outputs; a part of a gang that meets
  // other hosts still makes the gang's first collective (RunPart), so its
  // other hosts stop too. Parts running finish; with `end_simulated_time`,
  // those of them in their simulated time end it now (their results stand).
  // Returns how many parts it cancelled. `which` is called under the
  // queues' lock: it must not block.
  int CancelParts(absl::FunctionRef<bool(const RunKey& run)> which, absl::string_view reason,
                  bool end_simulated_time);
  // wire::CancelRuns, through CancelParts: `session`'s runs only (all of
  // them with `request.all()`).
  wire::CancelRunsReply CancelRuns(const wire::CancelRuns& request, SessionId session = kOneSession);

  // Ends `session` here (wire::EndSession: a service's tenant that has
  // gone). At once: every run of the session is dead here (a run that comes
  // from now on is refused; what other hosts send for one is dropped, its
  // sends go as the error) and loads and puts of the session are refused
  // (FailedPrecondition). Then, on a thread of the executor, once no load,
  // put or run of the session is under way: its parts that have not started
  // are cancelled, as CancelRuns with `all` would (Cancelled, "its tenant
  // ended: <reason>"), its parts in their simulated time end it now, its
  // parts waiting to meet other hosts stop waiting, its posted receives and
  // puts in progress fail, and its buffers are forgotten (each freed once
  // nothing running holds it). Once every run of it has finished (its reply
  // given): its device lists, functions and programs go, with their load
  // errors, and so do its collective groups. `done` gets OK then, on that
  // thread (under no lock of this object; it may call the executor), or
  // Cancelled if the executor is destroyed before. Another session's state
  // is untouched. Afterwards the session's ids name nothing (a fetch of its
  // buffer is NotFound, an unload or free does nothing) and its runs are
  // refused with the reason. Calling it again for the session is harmless:
  // its `done` gets OK too, once the steps under way are done.
  void EndSession(SessionId session, std::string reason, absl::AnyInvocable<void(absl::Status) &&> done);

  // The gangs across exactly `hosts` (increasing, this host among them) of
  // `session`'s runs started after this call meet in a fresh incarnation of
  // their collective group (each session's gangs meet in groups of their
  // own); those started before keep theirs (wire::RenewGroup). Every host
  // of the set must get it at the same place among the session's runs
  // (and counts it, whether or not a list of its own spans the set yet:
  // a process that replaced a lost host learns the lists as they are
  // needed). An incarnation is dropped once a newer one exists and no part
  // of its own is left. InvalidArgument for a set that is not one.
  absl::Status RenewGroup(absl::Span<const int> hosts, SessionId session = kOneSession);

  // `host` is lost (-1: every host; this one is stopping): every
  // collective group it belongs to breaks, so parts waiting for it to
  // arrive, or making a group with it, fail now with `why`, and so does
  // every later gang across it, until a new process replaces it
  // (PeerJoined). Parts inside a collective proper end at
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

  // Buffers held now, of every session (tests).
  int num_buffers() const;
  // Functions and programs loaded now, of every session, failed loads
  // included (tests).
  int num_functions() const;
  int num_programs() const;
  // Device lists defined now, of every session, failed definitions
  // included (tests).
  int num_lists() const;

 private:
  // InvalidArgument unless `host` is another host of the cluster.
  absl::Status CheckOtherHost(int host) const;
  struct Program;
  struct Function;
  struct Part;
  struct RunState;

  absl::StatusOr<const HostDeviceList*> List(SessionId session, int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The loads' checks and work; the callers keep their errors.
  absl::Status DefineDevicesChecked(const wire::DefineDevices& request, SessionId session);
  absl::Status LoadProgramLocked(const wire::LoadProgram& request, SessionId session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Internal if a part's inputs have other sizes than its function takes
  // (a client's mistake, never a read past a buffer); ResourceExhausted if
  // an output could not be allocated.
  absl::Status CheckSizes(const Part& part) const;
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
  void RunPart(Part& part, absl::Status& status, bool refused_in_gang, Scratch& scratch);
  // The refusal of `part`'s run, once a stop of its meeting was requested
  // (CancelRun); else OK.
  absl::Status RefusalOf(const Part& part) const;
  // What names `part`'s meeting with its gang's other hosts
  // (CollectiveGroup::Arrive): the same on each, and no other part's.
  static uint64_t MeetingOf(const Part& part);
  // Whether `part` meets other hosts in collectives (then it counts in its
  // group generation's parts from Enqueue until it has run).
  static bool MeetsOtherHosts(const Part& part);

  // A request of `session` that makes something here (`what`: a load, a
  // put, or with `run` a run) starts: OK, and counted as dispatching until
  // its EndDispatch (and a run as in flight until RunEnded, after its
  // reply, or until its EndDispatch with `run_ended` if it is refused),
  // or why not: the session ended or is ending (for a run the ending's
  // reason, else FailedPrecondition naming `what` and it). EndSession's
  // steps wait for these counts to drop to zero.
  absl::Status BeginDispatch(SessionId session, absl::string_view what, bool run = false);
  void EndDispatch(SessionId session, bool run_ended = false);
  void RunEnded(SessionId session);
  // The thread that carries the sessions being ended through their steps
  // (EndSession), and those steps.
  void EndSessionsLoop();
  void CancelSession(SessionId session, const std::string& reason, const absl::Status& why);
  void ForgetSession(SessionId session, const absl::Status& why);

  const HostLayout layout_;
  const int host_id_;  // layout_.host_id
  RendezvousStores* const stores_;
  std::atomic<bool> stopping_{false};
  // The sessions' runs, and the sessions being ended (EndSession). A leaf
  // lock: runs end on any thread, under whatever it holds. Declared before
  // the parts, so that it outlives whatever they complete.
  struct SessionRuns {
    int dispatching = 0;  // loads, puts and runs between BeginDispatch and EndDispatch
    int in_flight = 0;    // runs between BeginDispatch and RunEnded
  };
  struct Ending {
    std::string reason;  // "its tenant ended: <reason>"
    absl::Status why;    // Cancelled(reason): its runs' and buffers' error
    std::vector<absl::AnyInvocable<void(absl::Status) &&>> done;  // each EndSession's
    bool cancelled = false;   // CancelSession has run (or is running)
    bool forgetting = false;  // ForgetSession has started
  };
  Mutex sessions_mu_;
  CondVar sessions_cv_;  // signalled when an ending may take its next step, and on stopping
  // Entries only for sessions with runs counted (erased at zero).
  absl::flat_hash_map<SessionId, SessionRuns> session_runs_ ABSL_GUARDED_BY(sessions_mu_);
  absl::flat_hash_map<SessionId, Ending> endings_ ABSL_GUARDED_BY(sessions_mu_);
  std::thread ender_ ABSL_GUARDED_BY(sessions_mu_);  // started by the first EndSession
  // Checkpoint writes and reads (SaveShards, LoadShards), one at a time,
  // off the threads that serve requests and run gangs.
  Mutex storage_mu_;
  CondVar storage_cv_;
  // Each job runs with true, or, dropped as the host stops, with false.
  std::deque<absl::AnyInvocable<void(bool run) &&>> storage_jobs_ ABSL_GUARDED_BY(storage_mu_);
  bool storage_stopping_ ABSL_GUARDED_BY(storage_mu_) = false;
  std::thread storage_ ABSL_GUARDED_BY(storage_mu_);  // started by the first job
  // Queues `job` for the storage thread; runs it at once with false if the
  // host is stopping.
  void QueueStorageJob(absl::AnyInvocable<void(bool run) &&> job);
  void StorageLoop();
  // The parts (see the top), each locked on its own. Declared in the order
  // they use each other: a part uses only those above it.
  HostHealth health_;
  DeadRuns dead_runs_;
  HostBuffers buffers_;
  HostGroups groups_;
  HostTransfers transfers_;
  // The join's data plane addresses (a replacement's; else empty).
  const std::vector<std::string> data_addresses_;

  // The loads, by session and id.
  mutable Mutex mu_;  // the tables below
  absl::flat_hash_map<SessionKey, std::unique_ptr<HostDeviceList>> lists_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionKey, std::shared_ptr<const Function>> functions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionKey, std::shared_ptr<const Program>> programs_ ABSL_GUARDED_BY(mu_);
  // Why a load failed, by session and id (erased if a later load of the id works).
  absl::flat_hash_map<SessionKey, absl::Status> list_errors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionKey, absl::Status> function_errors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionKey, absl::Status> program_errors_ ABSL_GUARDED_BY(mu_);

  // The gang parts in order (the client's), in a queue per local device:
  // a part counts one down once it heads each of its devices' queues. The
  // same rule, and code, as the islands' gang schedulers in process.
  Mutex queue_mu_;
  GangOrder<Part*> order_ ABSL_GUARDED_BY(queue_mu_);
  // Parts ready to run, per local device (the part's first local device).
  struct Worker {
    Mutex mu;
    CondVar cv;
    std::deque<Part*> ready ABSL_GUARDED_BY(mu);
    std::thread thread;
  };
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_EXECUTOR_H_
