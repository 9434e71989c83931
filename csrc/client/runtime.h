#ifndef PATHWAYS_CLIENT_RUNTIME_H_
#define PATHWAYS_CLIENT_RUNTIME_H_

// The client process's runtime, the paper's single controller (§4): the
// simulated cluster with its resource manager, one gang scheduler per
// island, the per-host object stores, the executors (WorkerPool) and the
// parallel dispatcher, all in this process (the embedded default); with
// hosts as processes, the hosts' part runs in them (RemoteCluster, and on
// the hosts HostProcess and HostExecutor). The client library (paper §4.2)
// uses it to place compiled functions on virtual slices, lower programs and
// run them.
//
// Thread-safe. Default() creates the process-wide runtime on first use.

#include <atomic>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/cluster/cluster.h"
#include "csrc/cluster/device_list.h"
#include "csrc/coordination/transfer.h"
#include "csrc/dispatch/dispatcher.h"
#include "csrc/executor/delay_queue.h"
#include "csrc/executor/timeline.h"
#include "csrc/executor/worker_pool.h"
#include "csrc/object_store/object_store.h"
#include "csrc/client/tenant_options.h"
#include "csrc/resource_manager/resource_manager.h"
#include "csrc/scheduler/gang_scheduler.h"
#include "csrc/scheduler/hang_watchdog.h"

namespace pw {

class HostLinks;
class RemoteCluster;
class ServiceLink;

// Hosts as processes (TopologyOptions::hosts): what starts them. Given the
// options and the number of hosts, returns one address per host (in host
// order) and the cluster's secret, or why it could not. The Python package
// installs one (pathways._hosts); C++ tests install their own.
struct LaunchedHosts {
  std::vector<std::string> addresses;
  std::string secret;
  // Whatever must live as long as the runtime (the registry that hosts
  // started by hand registered with: its last replies must reach them).
  std::shared_ptr<void> keep_alive;
};
using HostLauncher = std::function<absl::StatusOr<LaunchedHosts>(const TopologyOptions& options, int num_hosts)>;

class Runtime {
 public:
  // Installs the launcher runtimes with host processes use (replacing any).
  static void SetHostLauncher(HostLauncher launcher);

  // A private runtime (tests make several). InvalidArgument for a bad
  // topology. With options.hosts other than in-process, it starts the hosts
  // with the launcher and connects to them: FailedPrecondition without a
  // launcher or in a build without host processes, else the launcher's or
  // the hosts' error.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const TopologyOptions& options);
  // A runtime that is a tenant of a service (pathways-server,
  // service/service.h): it connects to the service at `tenant.address`,
  // and its cluster is the service's (its topology, hosts=service), its
  // hosts the service's. The connection's error (service_link.h), or
  // FailedPrecondition in a build without host processes.
  static absl::StatusOr<std::unique_ptr<Runtime>> CreateTenant(const TenantOptions& tenant);

  // The process-wide runtime, created on first call from the options given to
  // ConfigureDefault(), else from the PATHWAYS_TOPOLOGY environment variable
  // (see ParseTopology), else the defaults. It is never destroyed; it stops
  // at ShutdownDefault(). FailedPrecondition in a child forked after it
  // started (see base/fork.h): its threads did not survive the fork.
  static absl::StatusOr<Runtime*> Default();
  // FailedPrecondition if the default runtime exists already.
  static absl::Status ConfigureDefault(const TopologyOptions& options);
  // The default runtime will be a tenant of this service (CreateTenant).
  // FailedPrecondition if it exists already.
  static absl::Status ConfigureDefaultTenant(const TenantOptions& tenant);
  // True once Default() has created the runtime.
  static bool DefaultExists();
  // True once ShutdownDefault() has begun.
  static bool DefaultIsShutDown();
  // Shuts the default runtime down (called at interpreter exit): see
  // Shutdown(); then, with host processes, ends the sessions with them
  // (HostLinks::Close), so that no thread of theirs runs while the process
  // exits. Does nothing in a forked child.
  static void ShutdownDefault();

  // Stops the runtime promptly, whatever is queued: from now on Execute()
  // and DevicePut() fail with Cancelled; the hang watchdog stops; gangs that
  // have not started are cancelled (their outputs fail with Cancelled,
  // without running kernels or simulated time); running gangs' simulated
  // time ends; running kernels and transfers finish; then the executor and
  // delay threads stop. Blocks until all that is done. With host processes
  // the same happens on the hosts (RemoteCluster::Cancel), and the wait for
  // them is bounded (5 s): runs they have not finished by then fail with
  // Cancelled here. Idempotent. The object may still be queried and
  // destroyed afterwards.
  void Shutdown();
  bool is_shut_down() const { return shut_down_.load(std::memory_order_acquire); }

  ~Runtime();

  const Cluster& cluster() const { return *cluster_; }
  DeviceListRegistry& registry() { return registry_; }
  ResourceManager& resource_manager() { return *resource_manager_; }
  ObjectStores& object_stores() { return *stores_; }
  GangScheduler& scheduler(int island) { return *schedulers_[island]; }
  WorkerPool& executor() { return *executor_; }
  ParallelDispatcher& dispatcher() { return *dispatcher_; }
  TransferStats& transfer_stats() { return stats_; }
  Timeline& timeline() { return timeline_; }
  // The host processes' client side; null when hosts are in process.
  RemoteCluster* remote() { return remote_.get(); }
  // The link to the service this runtime is a tenant of; null otherwise.
  ServiceLink* service() { return service_; }

  // A new client (tenant) with a proportional-share weight (> 0). Clients
  // live as long as the runtime. InvalidArgument for a bad weight.
  absl::StatusOr<SchedulingClient*> CreateClient(std::string name, double weight);
  // Every client created so far.
  std::vector<SchedulingClient*> clients();
  // Closes `client` (SchedulingClient::Close): it dispatches nothing more,
  // and its gangs that have not started run cancelled, so the memory they
  // hold comes back; with host processes, on the hosts too. Its running
  // gangs finish. Does not wait. Its buffers are freed when their handles go (the
  // bindings drop the Python handles a client owns).
  void CloseClient(SchedulingClient* client);
  // The memory accounts of the default client (work outside any client)
  // and of device_put.
  const MemoryAccount& default_client_memory() const { return default_memory_; }
  const MemoryAccount& device_put_memory() const { return *device_put_memory_; }

  // Sets the scheduling policy of every island's gang scheduler.
  // A tenant's asks its service (the policy of every tenant): its error.
  absl::Status SetSchedulingPolicy(SchedulingPolicy policy);
  // The policy in force (a tenant's: its service's).
  absl::StatusOr<SchedulingPolicy> scheduling_policy();

  // Fault injection (paper §4.6; pw.testing): marks `devices` failed, for
  // good (unless a new process replaces their host: ReplaceHost). Work on them fails with Unavailable naming the device: gangs that
  // have not started fail when they come to run (without running kernels),
  // gangs in their simulated time fail at once, transfers from or to them
  // fail, and the error flows to every dependent. The other devices keep
  // working. Thread-safe.
  void FailDevices(absl::Span<Device* const> devices);
  // A new host process at `address` (started with the cluster's secret)
  // takes the place of lost host `host`, whose devices are healthy again
  // once this returns OK (RemoteCluster::ReplaceHost). FailedPrecondition
  // with hosts in process (no host process to replace) or for a service's
  // tenant, and for a host that is not lost.
  absl::Status ReplaceHost(int host, const std::string& address);

  // What every gang that is enqueued but not running waits for, on every
  // island (scheduler/diagnosis.h). On demand; never on the dispatch path.
  Diagnosis Diagnose();
  // The hang watchdog, when TopologyOptions::hang_report_ns > 0 (else null):
  // take its reports with hang_watchdog()->TakeReport(). Stopped by Shutdown().
  HangWatchdog* hang_watchdog() { return watchdog_.get(); }

  // Places host data (row-major `dtype`, global `dims`) on `devices`, for
  // `client` (null: the default client). Waits for memory through `blocker`
  // as Execute() does. Cancelled after Shutdown(); FailedPrecondition for a
  // closed client.
  absl::StatusOr<std::shared_ptr<ShardedBuffer>> DevicePut(DType dtype, Dims dims, const void* data,
                                                           const DeviceList* devices,
                                                           SchedulingClient* client = nullptr,
                                                           Blocker* blocker = nullptr);
  // One buffer for LoadShards to make: row-major `dtype` of global `dims`
  // (dims[0] == devices->size()) on `devices`, read as `spec_json` says.
  struct ShardsLoad {
    DType dtype = DType::kF32;
    Dims dims;
    const DeviceList* devices = nullptr;
    std::string spec_json;
  };
  // Has the host processes read new buffers from the checkpoint in
  // directory `database`, each host its own shards (RemoteCluster::
  // LoadShards; pw.checkpointing): nothing passes through this process.
  // The buffers are charged as device_put's are, for `client` (null: the
  // default client), waiting for memory through `blocker`, and returned
  // pending: each becomes ready once its hosts have read it, or fails with
  // their error. FailedPrecondition with hosts in process (or for a closed
  // client), PermissionDenied for a service's tenant, InvalidArgument for
  // dims that do not match the devices, Cancelled after Shutdown().
  absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> LoadShards(const std::string& database,
                                                                         absl::Span<const ShardsLoad> loads,
                                                                         SchedulingClient* client = nullptr,
                                                                         Blocker* blocker = nullptr);
  // Runs `program` (see ParallelDispatcher::Execute), its buffers labeled
  // with the client's memory account. Cancelled after Shutdown();
  // FailedPrecondition for a closed client.
  absl::StatusOr<std::vector<std::shared_ptr<ShardedBuffer>>> Execute(const LoweredProgram& program,
                                                                      absl::Span<const ProgramArg> args,
                                                                      const ExecuteOptions& options = {});

  // Blocks until no gang is in flight on any island (nor any run on the
  // host processes).
  void AwaitQuiescence();
  // Like AwaitQuiescence(), giving up after `timeout_ns`; true if quiescent.
  bool AwaitQuiescenceFor(int64_t timeout_ns);
  // Per island, how many gangs have been submitted so far; with host
  // processes, then the runs dispatched to them so far.
  std::vector<int64_t> SubmissionMarks();
  // Waits up to `timeout_ns` until every gang submitted before `marks` were
  // taken has finished, even if other threads keep submitting; true if so.
  bool AwaitSubmittedBefore(const std::vector<int64_t>& marks, int64_t timeout_ns);
  // Blocks until every gang submitted before the call has finished.
  void AwaitSubmittedSoFar();

 private:
  Runtime() = default;
  // Create's body; with `links`, the hosts are reached through them (a
  // tenant's service) instead of started here.
  static absl::StatusOr<std::unique_ptr<Runtime>> CreateWith(const TopologyOptions& options,
                                                             std::unique_ptr<HostLinks> links);
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ResourceManager> resource_manager_;
  std::unique_ptr<ObjectStores> stores_;
  std::vector<std::unique_ptr<GangScheduler>> schedulers_;
  TransferStats stats_;
  std::unique_ptr<InterconnectModel> interconnect_;  // null: no model (the topology's ici_*/dcn_* keys are 0)
  Timeline timeline_;
  std::unique_ptr<DelayQueue> delays_;
  std::unique_ptr<WorkerPool> executor_;
  std::unique_ptr<ParallelDispatcher> dispatcher_;
  std::vector<GangScheduler*> scheduler_ptrs_;  // schedulers_, by island id
  std::unique_ptr<HangWatchdog> watchdog_;
  std::shared_ptr<RemoteCluster> remote_;  // shared_ptr: the type is known only with host processes
  std::shared_ptr<void> launcher_state_;    // LaunchedHosts::keep_alive
  ServiceLink* service_ = nullptr;          // owned by remote_ (its links)
  // Set once by Shutdown(); gangs read it through GangServices::cancelled.
  std::atomic<bool> shut_down_{false};
  // Execute() and DevicePut() calls under way; Shutdown() waits for them to
  // leave before it stops the threads they submit work to.
  std::atomic<int> active_calls_{0};
  friend class ActiveCall;
  Mutex shutdown_mu_;  // held for the whole of Shutdown()
  Mutex clients_mu_;
  std::vector<std::unique_ptr<SchedulingClient>> clients_ ABSL_GUARDED_BY(clients_mu_);
  MemoryAccount default_memory_{"default"};
  std::shared_ptr<MemoryAccount> device_put_memory_ = std::make_shared<MemoryAccount>("device_put");
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_RUNTIME_H_
