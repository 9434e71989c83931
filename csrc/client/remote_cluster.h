#ifndef PATHWAYS_CLIENT_REMOTE_CLUSTER_H_
#define PATHWAYS_CLIENT_REMOTE_CLUSTER_H_

// The client's side of hosts as processes (paper §4, Figure 3): programs
// and buffers live in the host processes (host/host_executor.h); the client
// keeps the bookkeeping (memory charged per device, the buffers' readiness)
// and sends each host its part of every dispatch.
//
// Parallel dispatch sends each host that takes part in a program ONE
// RunProgram message: the host learned the program's steps that concern it
// (LoadProgram), its functions and device lists the first time, under ids.
// All hosts get their messages in one global order (one lock around a
// dispatch), so every device queue holds its gangs in the same order on
// every host: the gang scheduler of §4.4 with the FIFO policy.
//
// A run's buffers become ready when every host that takes part has replied
// that its part is done; a host reports the buffers that failed on it.
// Reading a buffer fetches each host's shards; dropping it frees them.
//
// Refusals are heard. Loads (DefineDevices, LoadFunction, LoadProgram) are
// answered: a program's first dispatch waits for the answers to its loads
// (one round trip, once per program), and a load a host refused fails that
// dispatch and every later one of the program with the host's error ("host 1
// could not load function 'f': ..."), before anything is sent. A host that
// refuses a run (its reply is the error) fails the run as a whole, and the
// client cancels the run on its other hosts (wire::CancelRun), which would
// otherwise wait for that host's transfers or collectives.
//
// Ids (buffers, functions, programs, gang tags) are this client's, and so
// is the single order of its sends (mu_). The hosts key every id by client
// session (host/host_executor.h, "Ids"): a client that owns its hosts
// sends session 0's; a service's tenant (links through a ServiceLink) has
// the session its service gave it, and the service puts every tenant's
// runs in one order (service/service.h).
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/client/host_sessions.h"
#include "csrc/cluster/device_list.h"
#include "csrc/dispatch/dispatcher.h"
#include "csrc/executor/timeline.h"
#include "csrc/object_store/sharded_buffer.h"
#include "csrc/scheduler/diagnosis.h"
#include "csrc/scheduler/fair_queue.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {

// What the client's own bookkeeping the hosts' work reports to. Everything
// must outlive the RemoteCluster.
struct RemoteServices {
  // The client's account of device memory: the hosts' buffers are charged
  // there.
  ObjectStores* stores = nullptr;
  TransferStats* stats = nullptr;          // transfers between slices
  Timeline* timeline = nullptr;            // gangs' parts, while it records
  std::vector<GangScheduler*> schedulers;  // by island: devices' busy time
  DeviceListRegistry* registry = nullptr;  // each host's part of a list
};

class RemoteCluster final : public RemoteShards, public RemoteDispatch {
 public:
  // Connects to the hosts (one address per host of `cluster`), configures
  // them and joins them into one cluster (their data plane connected). The
  // cluster must outlive the result.
  static absl::StatusOr<std::unique_ptr<RemoteCluster>> Connect(const Cluster& cluster, RemoteServices services,
                                                                const std::vector<std::string>& addresses,
                                                                const std::string& secret);
  // A RemoteCluster over hosts it reaches through `links` (ready: hosts
  // configured and joined). With a ServiceLink, this client is a tenant of
  // a service, which owns the hosts and admits the runs (SetPolicy is the
  // service's then: see service_link.h).
  static std::unique_ptr<RemoteCluster> Attach(const Cluster& cluster, RemoteServices services,
                                               std::unique_ptr<HostLinks> links);
  ~RemoteCluster();
  HostLinks& links() { return *links_; }

  std::vector<RemoteHostInfo> hosts() const { return links_->hosts(); }
  // Control messages (frames on the wire: requests batched) sent to each
  // host so far; heartbeats not counted.
  std::vector<int64_t> messages_sent() const;

  // The order policy of the hosts' gangs, as the islands' gang schedulers'
  // (§4.4, §5.2). FIFO sends each run as it is dispatched. Proportional
  // share queues runs per client and sends them in start-time fair queueing
  // order, at most kAdmissionWindow unfinished per island, so each
  // backlogged client gets device time in proportion to its weight. A run
  // is never sent before the runs that make its arguments.
  void SetPolicy(SchedulingPolicy policy);

  // Adds the gangs of runs on the hosts that have not finished, and what
  // each waits for, to `diagnosis` (pw.diagnose): each host describes its
  // device queues (waiting at most `timeout_ns` for them); runs still
  // queued here wait for admission. As scheduler/diagnosis.h's Diagnose:
  // with `min_wait_ns`, only gangs that have waited that long (and the hosts
  // are asked only if a run in flight is that old); with `take`, only gangs
  // no earlier take reported (the hang watchdog). remote_diagnosis.cc.
  void Describe(Diagnosis& diagnosis, int64_t timeout_ns, int64_t min_wait_ns = 0, bool take = false);

  // Has `host` write its shards of buffers into a checkpoint's database
  // (wire::SaveShards; pw.checkpointing) and waits for it: the buffers must
  // be done here (the hosts have them). The host's error (a buffer's, the
  // writer's, HostLostError), or PermissionDenied for a service's tenant
  // (the hosts are not its to write files with).
  absl::Status SaveShards(int host, wire::SaveShards request);
  // Has the hosts read `buffers` from the checkpoint in directory
  // `database` (wire::LoadShards; pw.checkpointing): every host with a shard
  // of a buffer reads its own shards (each of a replicated buffer's hosts
  // reads the whole array), straight into the buffer's memory there; no
  // shard passes through this process. `buffers` are fresh (allocated with
  // this cluster as their RemoteShards, pending) and `specs` parallel to
  // them: what the hosts' shard reader needs (host/shard_reader.h). The
  // hosts make the buffers at once, so work dispatched after this call may
  // use them (it waits for them there). Returns once sent; each buffer
  // becomes ready when every host of it has answered, or fails with the
  // first error (the reader's, naming its host; HostLostError). A buffer
  // holds its memory here until then, whoever else drops it.
  // PermissionDenied for a service's tenant, InvalidArgument for a buffer
  // that is not fresh: nothing is sent then, and the caller fails them.
  absl::Status LoadShards(const std::string& database, absl::Span<const std::shared_ptr<ShardedBuffer>> buffers,
                          absl::Span<const std::string> specs);

  // A new host process at `address` takes the place of lost host `host`
  // (HostSessions::ReplaceHost), under the dispatch lock: what the lost
  // process had loaded is forgotten here (sent again when needed), and so
  // are its buffers' frees; programs with a step on it are planned anew;
  // its devices are healthy again. Buffers made before stay lost: the new
  // process answers for them with HostLost. FailedPrecondition for a
  // service's tenant (the hosts are the service's), else HostSessions::
  // ReplaceHost's errors.
  absl::Status ReplaceHost(int host, const std::string& address);

  // Fault injection (Runtime::FailDevices): tells the hosts of `devices`
  // that they have failed, so their parts and transfers fail there too.
  // Waits (bounded) until every such host has taken it; a lost host is
  // skipped (its devices are gone anyway).
  void FailDevices(absl::Span<Device* const> devices);

  // Cancels the runs that have not started, as the in-process runtime's
  // gangs are cancelled (Runtime::CloseClient, Runtime::Shutdown): those of
  // `client`, or with null those of every client. Runs still waiting for
  // admission here finish at once, failed with Cancelled; every live host is
  // told to cancel its parts of the others that have not started
  // (HostExecutor::CancelParts), which fail with Cancelled ("'f' in program
  // 'p' was cancelled: <reason>"), and so do their outputs. Parts running
  // finish; with `end_simulated_time`, their simulated time ends now. From
  // then on a run of a closed client (or, after a cancel of every client,
  // any run) is cancelled here instead of sent. Does not wait for the hosts.
  void Cancel(const SchedulingClient* client, const std::string& reason, bool end_simulated_time);
  // Fails the runs still in flight with `why` without waiting for their
  // hosts, whose replies are then ignored: the end of a shutdown's bounded
  // wait. Their parts may still run on the hosts.
  void Abandon(const absl::Status& why);

  // Runs in flight, in dispatch order: a mark now, and whether every run
  // dispatched before `mark` has finished (its buffers complete).
  int64_t SubmissionMark() const;
  bool FinishedBefore(int64_t mark) const;
  bool Quiescent() const { return FinishedBefore(SubmissionMark()); }

  // RemoteShards
  uint64_t NewBufferId() override { return next_buffer_id_.fetch_add(1, std::memory_order_relaxed); }
  absl::Status Write(const ShardedBuffer& buffer, const void* data) override;
  absl::Status Read(const ShardedBuffer& buffer, void* dst) override;
  void Free(const ShardedBuffer& buffer) override;

  // RemoteDispatch
  absl::Status DispatchSteps(const LoweredProgram& program, absl::Span<const ProgramArg> args,
                             const ExecuteOptions& options, const BufferOwner& owner,
                             std::vector<std::shared_ptr<ShardedBuffer>>& slots) override;

 private:
  struct Plan;
  struct Run;
  struct LoadReply;
  RemoteCluster() = default;

  // Queues `request` for `host`; `done` gets the reply (null: none wanted).
  void Send(int host, wire::Request request, HostChannel::ReplyCallback done = nullptr);
  const DeviceList* ListById(int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes sure `host` knows `list` / the function (sending them if not,
  // with a reply wanted); `plan`, if given, needs them: their answer (the
  // one to come, or the one come already) joins its loads.
  void EnsureList(int host, const DeviceList* list, Plan* plan = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t EnsureFunction(int host, const CompiledFunction& fn, Plan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a load to `host`; its answer goes to the result (`what` names it
  // in its error).
  std::shared_ptr<LoadReply> SendLoad(int host, wire::Request request, std::string what);
  // Waits (outside mu_) until every load `plan` needs is answered, once;
  // at once after that. The first refusal, as the program's error.
  absl::Status AwaitLoads(Plan& plan);
  // Host `refuser` refused `run` with `why`: every host of the run cancels
  // it (told once per refuser). Any thread; does not block.
  void CancelRunOn(Run& run, int refuser, const absl::Status& why);
  std::shared_ptr<Plan> PlanFor(const LoweredProgram& program) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Caches that follow what the caller holds: once a lowered program is
  // gone and no run holds its plan, the plan goes, and the hosts unload its
  // programs; once a function's IR is gone (no program of it can be live,
  // nor a run of one), its id goes, and the hosts unload it (wire::Unload,
  // after every run that named it). Called where entries are made, once
  // the tables have doubled since the last sweep: amortized O(1), and the
  // tables hold at most twice what is live, plus kMinReclaim.
  void MaybeReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the unloads of program `program_id`'s plan, by host (its
  // sequential steps' programs too), to `unloads`.
  static void AddUnloads(uint64_t program_id, const Plan& plan, std::vector<wire::Request>& unloads);
  // Every host with a shard of `list`, increasing (computed once per list;
  // the reference stays valid: entries are never removed).
  const std::vector<int>& HostsOf(const DeviceList* list) const;
  // This host's shards of a buffer on `list`: shard positions, in order.
  std::vector<int> PositionsOn(const DeviceList* list, int host) const;
  // The devices of `list` on `host`, as a list (interned once per pair).
  const DeviceList* PartOn(const DeviceList* list, int host) const;
  // A host ran its part of step `step` of `run` from `start_ns` to `end_ns`
  // (its clock): the client's accounts and the timeline see it.
  void RecordPart(const Run& run, int host, int step, int64_t start_ns, int64_t end_ns) const;
  // The run leaves the runs in flight.
  void Retire(const Run& run);
  // If `run` must not be sent (its client closed, or every run cancelled),
  // finishes it failed with Cancelled; true then.
  bool CancelledBeforeSending(Run& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A part of step `step` of `run` failed on a host: if the step is a gang
  // that meets several hosts in collectives, its group may have broken, and
  // the gangs sent from now on meet in a fresh incarnation (RenewGroup).
  void GroupMayHaveBroken(const Run& run, int step);
  // Sends the renewals GroupMayHaveBroken asked for, ahead of the next run.
  void SendRenewalsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One host's put requests for a buffer's data (its shards, in chunks).
  struct HostPuts {
    int host = 0;
    std::vector<wire::Request> requests;
  };
  // The puts that carry `data` (every shard of a buffer `id` on `list`,
  // shard-major) to its hosts. Copies the data: called without mu_.
  std::vector<HostPuts> MakePuts(const DeviceList* list, int64_t shard, uint64_t id, const void* data) const;
  // Sends them in order (after the list, to a host that does not know it).
  void SendPutsLocked(const DeviceList* list, std::vector<HostPuts> puts, bool flush)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends what is queued for `host` as one message.
  void Flush(int host);
  // Moves the frees waiting for `host` into `run`.
  void TakeFrees(int host, wire::RunProgram* run);
  // Sends `host` the program `program_id`: `step` alone, or no step; its
  // answer joins `plan`'s loads.
  void LoadOn(int host, uint64_t program_id, const LoweredProgram& program, const wire::ProgramStep* step,
              Plan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `run` (SendRun's arguments) to `hosts` now, or queues it for
  // admission (see SetPolicy). `cost_ns`: its device time for proportional
  // share; `islands`: those it runs on.
  void SubmitRun(std::vector<int> hosts, uint64_t program_id, uint64_t first, std::vector<wire::ArgBinding> bindings,
                 std::shared_ptr<Run> run, double cost_ns, std::vector<int> islands) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the queued runs that may go now.
  void AdmitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admits runs whenever finished runs make room (their replies come on
  // gRPC threads, which must not wait for mu_).
  void AdmissionLoop();
  // A run admitted under proportional share finished.
  void Released(const std::vector<int>& islands);
  // Sends one RunProgram to each of run->hosts; `run` completes its buffers
  // once they have all replied.
  void SendRun(uint64_t program_id, uint64_t first, const std::vector<wire::ArgBinding>& bindings,
               std::shared_ptr<Run> run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Cluster* cluster_ = nullptr;
  RemoteServices services_;
  ObjectStores* stores_ = nullptr;  // services_.stores
  std::unique_ptr<HostLinks> links_;
  std::unique_ptr<std::atomic<int64_t>[]> messages_;  // per host
  // Buffers dropped, by host, not yet told: they leave with the host's next
  // run, or on their own once kFreesPerMessage wait or a buffer of at least
  // kFreeAtOnceBytes goes.
  static constexpr size_t kFreesPerMessage = 256;
  static constexpr int64_t kFreeAtOnceBytes = int64_t{1} << 20;
  mutable Mutex hosts_mu_;
  mutable absl::node_hash_map<int, std::vector<int>> hosts_of_ ABSL_GUARDED_BY(hosts_mu_);  // stable references
  mutable absl::flat_hash_map<std::pair<int, int>, const DeviceList*> parts_on_ ABSL_GUARDED_BY(hosts_mu_);
  // Sequence numbers of the runs in flight (dispatch order).
  mutable Mutex runs_mu_;
  std::set<int64_t> runs_in_flight_ ABSL_GUARDED_BY(runs_mu_);
  // The same runs by (program id, first buffer id): what hosts name them by.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::weak_ptr<Run>> runs_by_id_ ABSL_GUARDED_BY(runs_mu_);
  int64_t next_run_seq_ ABSL_GUARDED_BY(runs_mu_) = 0;
  int64_t next_gang_ ABSL_GUARDED_BY(runs_mu_) = 0;
  Mutex frees_mu_;
  std::vector<std::vector<uint64_t>> pending_frees_ ABSL_GUARDED_BY(frees_mu_);
  std::atomic<uint64_t> next_buffer_id_{1};
  // Gangs a take of Describe reported: (program id, first buffer id, step);
  // forgotten once their run has finished.
  Mutex reported_mu_;
  absl::flat_hash_set<std::tuple<uint64_t, uint64_t, int>> reported_ ABSL_GUARDED_BY(reported_mu_);

  // One dispatch at a time, so every host sees the same order; guards what
  // each host knows.
  mutable Mutex mu_;
  // What each host was sent, and its answer (to come, or come).
  struct HostState {
    absl::flat_hash_map<int, std::shared_ptr<LoadReply>> lists;
    absl::flat_hash_map<uint64_t, std::shared_ptr<LoadReply>> functions;
  };
  std::vector<HostState> known_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, const DeviceList*> lists_by_id_ ABSL_GUARDED_BY(mu_);
  // Function ids by IR. The IR is held weakly: an entry whose IR is gone is
  // stale (its address may be reused by a new IR, which gets a new id).
  struct FunctionEntry {
    uint64_t id = 0;
    std::weak_ptr<const void> ir;
  };
  absl::flat_hash_map<const void*, FunctionEntry> function_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t next_function_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Plan>> plans_ ABSL_GUARDED_BY(mu_);
  // ReclaimLocked runs when plans_ and function_ids_ together reach this.
  static constexpr size_t kMinReclaim = 64;
  size_t reclaim_at_ ABSL_GUARDED_BY(mu_) = kMinReclaim;

  // Admission (SetPolicy). Locked after mu_ when both are.
  struct Waiting;
  Mutex admission_mu_;
  CondVar admission_cv_;
  SchedulingPolicy policy_ ABSL_GUARDED_BY(admission_mu_) = SchedulingPolicy::kFifo;
  // Runs not sent yet, per client: sent in dispatch order (FIFO) or by
  // start-time fair queueing, as the islands' gang schedulers admit gangs.
  FairQueue<std::unique_ptr<Waiting>> waiting_ ABSL_GUARDED_BY(admission_mu_);
  std::vector<int> admitted_ ABSL_GUARDED_BY(admission_mu_);  // per island: unfinished, under proportional share
  // Buffers that runs still queued will make: a run using one waits.
  absl::flat_hash_set<uint64_t> unsent_buffers_ ABSL_GUARDED_BY(admission_mu_);
  bool admission_wanted_ ABSL_GUARDED_BY(admission_mu_) = false;
  // Set by a Cancel of every client: no run is sent any more.
  std::atomic<bool> cancel_all_{false};
  std::string cancel_all_reason_ ABSL_GUARDED_BY(mu_);
  // Sets of hosts whose group the next dispatch renews (GroupMayHaveBroken:
  // on gRPC threads, which must not wait for mu_).
  Mutex renew_mu_;
  std::set<std::vector<int>> renew_ ABSL_GUARDED_BY(renew_mu_);
  std::atomic<bool> renew_pending_{false};
  bool stopping_ ABSL_GUARDED_BY(admission_mu_) = false;
  std::thread admission_thread_;
  uint32_t next_gang_tag_ ABSL_GUARDED_BY(mu_) = 1;
  // Set before the sessions end: no cancel is sent from then on (CancelRunOn
  // runs on gRPC threads, and sends while holding it).
  Mutex closing_mu_;
  bool closing_ ABSL_GUARDED_BY(closing_mu_) = false;
  // Ids of the per-step programs of sequential dispatch: apart from
  // LoweredProgram ids (which count from 1).
  uint64_t next_sequential_id_ ABSL_GUARDED_BY(mu_) = uint64_t{1} << 62;
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_REMOTE_CLUSTER_H_
