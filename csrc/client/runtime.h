#ifndef PATHWAYS_CLIENT_RUNTIME_H_
#define PATHWAYS_CLIENT_RUNTIME_H_

// The runtime a client talks to: the simulated cluster with its resource
// manager, one gang scheduler per island, the per-host object stores, the
// executors and the parallel dispatcher, all in this process (the embedded
// default). The client library (paper §4.2) uses it to place compiled
// functions on virtual slices, lower programs and run them.
//
// Thread-safe. Default() creates the process-wide runtime on first use.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/cluster/cluster.h"
#include "csrc/cluster/device_list.h"
#include "csrc/coordination/transfer.h"
#include "csrc/dispatch/dispatcher.h"
#include "csrc/executor/delay_queue.h"
#include "csrc/executor/executor.h"
#include "csrc/executor/timeline.h"
#include "csrc/object_store/object_store.h"
#include "csrc/resource_manager/resource_manager.h"
#include "csrc/scheduler/gang_scheduler.h"

namespace pw {

class Runtime {
 public:
  // A private runtime (tests make several). InvalidArgument for a bad topology.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const TopologyOptions& options);

  // The process-wide runtime, created on first call from the options given to
  // ConfigureDefault(), else from the PATHWAYS_TOPOLOGY environment variable
  // (see ParseTopology), else the defaults. It is never destroyed; its
  // executor threads stop at ShutdownDefault().
  static absl::StatusOr<Runtime*> Default();
  // FailedPrecondition if the default runtime exists already.
  static absl::Status ConfigureDefault(const TopologyOptions& options);
  // True once Default() has created the runtime.
  static bool DefaultExists();
  // Waits for in-flight work and stops the default runtime's executors
  // (called at interpreter exit). The runtime must not be used afterwards.
  static void ShutdownDefault();

  ~Runtime();

  const Cluster& cluster() const { return *cluster_; }
  DeviceListRegistry& registry() { return registry_; }
  ResourceManager& resource_manager() { return *resource_manager_; }
  ObjectStores& object_stores() { return *stores_; }
  GangScheduler& scheduler(int island) { return *schedulers_[island]; }
  Executor& executor() { return *executor_; }
  ParallelDispatcher& dispatcher() { return *dispatcher_; }
  TransferStats& transfer_stats() { return stats_; }
  Timeline& timeline() { return timeline_; }

  // A new client (tenant) with a proportional-share weight (> 0). Clients
  // live as long as the runtime. InvalidArgument for a bad weight.
  absl::StatusOr<SchedulingClient*> CreateClient(std::string name, double weight);
  // Every client created so far.
  std::vector<SchedulingClient*> clients();

  // Sets the scheduling policy of every island's gang scheduler.
  void SetSchedulingPolicy(SchedulingPolicy policy);

  // Places host data (row-major `dtype`, global `dims`) on `devices`.
  absl::StatusOr<std::shared_ptr<ShardedBuffer>> DevicePut(DType dtype, Dims dims, const void* data,
                                                           const DeviceList* devices);

  // Blocks until no gang is in flight on any island.
  void AwaitQuiescence();
  // Blocks until every gang submitted before the call has finished, even if
  // other threads keep submitting.
  void AwaitSubmittedSoFar();

 private:
  Runtime() = default;
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ResourceManager> resource_manager_;
  std::unique_ptr<ObjectStores> stores_;
  std::vector<std::unique_ptr<GangScheduler>> schedulers_;
  TransferStats stats_;
  Timeline timeline_;
  std::unique_ptr<DelayQueue> delays_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<ParallelDispatcher> dispatcher_;
  Mutex clients_mu_;
  std::vector<std::unique_ptr<SchedulingClient>> clients_ ABSL_GUARDED_BY(clients_mu_);
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_RUNTIME_H_
