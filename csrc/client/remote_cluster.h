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
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/client/host_pool.h"
#include "csrc/dispatch/dispatcher.h"
#include "csrc/object_store/sharded_buffer.h"

namespace pw {

class RemoteCluster final : public RemoteShards, public RemoteDispatch {
 public:
  // Connects to the hosts (one address per host of `cluster`), configures
  // them and joins them into one cluster (their data plane connected). The
  // cluster must outlive the result.
  // `stores` keeps the client's account of device memory (the hosts'
  // buffers are charged there); `stats` counts the transfers between slices.
  static absl::StatusOr<std::unique_ptr<RemoteCluster>> Connect(const Cluster& cluster, ObjectStores* stores,
                                                                TransferStats* stats,
                                                                const std::vector<std::string>& addresses,
                                                                const std::string& secret);
  ~RemoteCluster();

  HostPool& pool() { return *pool_; }
  std::vector<RemoteHostInfo> hosts() const { return pool_->hosts(); }
  // Control messages (frames on the wire: requests batched) sent to each
  // host so far; heartbeats not counted.
  std::vector<int64_t> messages_sent() const;

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
  RemoteCluster() = default;

  // Queues `request` for `host`; `done` gets the reply (null: none wanted).
  void Send(int host, wire::Request request, HostChannel::ReplyCallback done = nullptr);
  const DeviceList* ListById(int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes sure `host` knows `list` / the function (sending them if not).
  void EnsureList(int host, const DeviceList* list) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t EnsureFunction(int host, const CompiledFunction& fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Plan& PlanFor(const LoweredProgram& program) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every host with a shard of `list`, increasing (computed once per list;
  // the reference stays valid: entries are never removed).
  const std::vector<int>& HostsOf(const DeviceList* list) const;
  // This host's shards of a buffer on `list`: shard positions, in order.
  std::vector<int> PositionsOn(const DeviceList* list, int host) const;
  // Queues the puts of `buffer`'s shards; sends them at once if `flush`.
  void WriteLocked(const ShardedBuffer& buffer, const void* data, bool flush) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends what is queued for `host` as one message.
  void Flush(int host);
  // Moves the frees waiting for `host` into `run`.
  void TakeFrees(int host, wire::RunProgram* run);
  // Sends `host` the program `program_id`: `step` alone, or no step.
  void LoadOn(int host, uint64_t program_id, const LoweredProgram& program, const wire::ProgramStep* step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one RunProgram to each of `hosts`; `run` completes its buffers
  // once they have all replied.
  void SendRun(const std::vector<int>& hosts, uint64_t program_id, uint64_t first,
               const std::vector<wire::ArgBinding>& bindings, std::shared_ptr<Run> run)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Cluster* cluster_ = nullptr;
  ObjectStores* stores_ = nullptr;
  TransferStats* stats_ = nullptr;
  std::unique_ptr<HostPool> pool_;
  std::unique_ptr<std::atomic<int64_t>[]> messages_;  // per host
  // Buffers dropped, by host, not yet told: they leave with the host's next
  // run, or on their own once kFreesPerMessage wait or a buffer of at least
  // kFreeAtOnceBytes goes.
  static constexpr size_t kFreesPerMessage = 256;
  static constexpr int64_t kFreeAtOnceBytes = int64_t{1} << 20;
  mutable Mutex hosts_mu_;
  mutable absl::node_hash_map<int, std::vector<int>> hosts_of_ ABSL_GUARDED_BY(hosts_mu_);  // stable references
  Mutex frees_mu_;
  std::vector<std::vector<uint64_t>> pending_frees_ ABSL_GUARDED_BY(frees_mu_);
  std::atomic<uint64_t> next_buffer_id_{1};

  // One dispatch at a time, so every host sees the same order; guards what
  // each host knows.
  mutable Mutex mu_;
  struct HostState {
    absl::flat_hash_set<int> lists;
    absl::flat_hash_set<uint64_t> functions;
  };
  std::vector<HostState> known_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, const DeviceList*> lists_by_id_ ABSL_GUARDED_BY(mu_);
  // Function ids by IR (holding the IR, so its address is never reused).
  absl::flat_hash_map<const void*, std::pair<uint64_t, std::shared_ptr<const void>>> function_ids_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Plan>> plans_ ABSL_GUARDED_BY(mu_);
  uint32_t next_gang_tag_ ABSL_GUARDED_BY(mu_) = 1;
  // Ids of the per-step programs of sequential dispatch: apart from
  // LoweredProgram ids (which count from 1).
  uint64_t next_sequential_id_ ABSL_GUARDED_BY(mu_) = uint64_t{1} << 62;
};

}  // namespace pw

#endif  // PATHWAYS_CLIENT_REMOTE_CLUSTER_H_
