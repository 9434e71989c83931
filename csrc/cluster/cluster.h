#ifndef PATHWAYS_CLUSTER_CLUSTER_H_
#define PATHWAYS_CLUSTER_CLUSTER_H_

// The physical topology of simulated accelerators (paper §4.1, Figure 3):
// islands of hosts, each host with its devices. Devices inside an island talk
// over ICI; islands talk over DCN.
//
// A Device is not a thread: it is an in-order execution stream whose queue
// lives in its island's GangScheduler, executed by a shared pool of executor
// threads, so one process can hold thousands of devices.
//
// A Cluster is immutable after Create() and thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "csrc/base/mutex.h"

namespace pw {

class Host;
class Island;

// Where the hosts run: threads of this process (the embedded default); one
// process per host that the client starts on this machine; one per node of
// a Ray cluster; or processes started by someone else (by hand, Slurm,
// Kubernetes: `pathways-host --client=ADDRESS`) that register with the client;
// or a service's (pathways-server, service/service.h), whose tenant this
// process is (never parsed: connecting to the service sets it).
enum class HostsMode : uint8_t { kInProcess, kLocalProcesses, kRay, kExternal, kService };

// "in_process", "local_processes", "ray", "external", "service".
absl::string_view HostsModeName(HostsMode mode);

struct TopologyOptions {
  HostsMode hosts = HostsMode::kInProcess;
  int num_islands = 2;
  int hosts_per_island = 2;
  int devices_per_host = 4;
  // Simulated device memory (HBM) per device. The bytes are real host memory.
  int64_t device_memory_bytes = int64_t{1} << 30;
  std::string device_kind = "tpu";
  // Executor threads (the WorkerPool) shared by all devices; 0 picks the
  // number of cores.
  int num_executor_threads = 0;
  // Executor threads one kernel may split its loop over (a large product or
  // fused loop, base/parallel_for.h): 0 (the default) all of them, 1 none (a
  // gang's shards still run in parallel, each on one thread). Like XLA:CPU's
  // intra-op thread pool.
  int intra_op_threads = 0;
  // Modeled latency of one control message from the client to a host, or
  // between hosts (DCN), in the dispatch path (paper §4.3, §4.5). 0: none,
  // as in one process. Parallel dispatch pays it once per program (every
  // host gets its message at once); sequential dispatch once per node.
  int64_t control_latency_ns = 0;
  // A gang that has not started this long after its submission is reported
  // once by the hang watchdog (HangWatchdog); 0: no watchdog.
  int64_t hang_report_ns = int64_t{60} * 1'000'000'000;
  // The interconnect model (coordination/interconnect.h), in process only:
  // a transfer between slices holds the links it crosses for latency +
  // bytes / bandwidth, and its destination is ready no earlier. Inside an
  // island (ICI) every device has one port each way; across islands (DCN)
  // every host has one NIC each way, shared by all its devices' transfers.
  // Bandwidths are in bits per second, each way; 0: unlimited. All four 0
  // (the default): no model, a transfer is done once copied, as before.
  int64_t ici_latency_ns = 0;
  int64_t ici_bandwidth_bps = 0;  // per device port
  int64_t dcn_latency_ns = 0;
  int64_t dcn_bandwidth_bps = 0;  // per host NIC

  // True if a transfer costs modeled time (some interconnect key is not 0).
  bool models_interconnect() const {
    return ici_latency_ns != 0 || ici_bandwidth_bps != 0 || dcn_latency_ns != 0 || dcn_bandwidth_bps != 0;
  }

  std::string ToString() const;
};

// The limits of a topology, checked up front by ParseTopology and
// Cluster::Create (so a bad spec never starts allocating):
//   islands, hosts_per_island, devices_per_host: >= 1, and
//     islands x hosts_per_island x devices_per_host <= kMaxDevices;
//   device_memory: 1 byte to kMaxDeviceMemoryBytes per device (so totals
//     over all devices stay far inside int64);
//   executor_threads: 0 (one per core, at most 4) to kMaxExecutorThreads;
//   intra_op_threads: 0 (all executor threads) to kMaxExecutorThreads;
//   control_latency_us: a finite number from 0 to kMaxControlLatencyNs / 1000;
//   hang_report_seconds: a finite number from 0 to kMaxHangReportNs / 1e9;
//   ici_latency_us, dcn_latency_us: a finite number from 0 to
//     kMaxLinkLatencyNs / 1000;
//   ici_bandwidth_gbps, dcn_bandwidth_gbps: 0 (unlimited), or a finite
//     number from kMinLinkBandwidthBps / 1e9 to kMaxLinkBandwidthBps / 1e9;
//   and the interconnect keys only with hosts=in_process (host processes
//     move their bytes over real sockets, which the model does not slow).
inline constexpr int kMaxDevices = 1 << 16;
inline constexpr int64_t kMaxDeviceMemoryBytes = int64_t{1} << 40;  // 1 TiB
inline constexpr int kMaxExecutorThreads = 256;
inline constexpr int64_t kMaxControlLatencyNs = 1'000'000'000;  // 1 s
inline constexpr int64_t kMaxHangReportNs = int64_t{86400} * 1'000'000'000;  // 1 day
inline constexpr int64_t kMaxLinkLatencyNs = 1'000'000'000;                 // 1 s
inline constexpr int64_t kMinLinkBandwidthBps = 1'000'000;                  // 1 Mbit/s
inline constexpr int64_t kMaxLinkBandwidthBps = int64_t{1'000'000} * 1'000'000'000;  // 1 Pbit/s

// InvalidArgument naming the key and its limit unless `options` is within
// the limits above.
absl::Status ValidateTopology(const TopologyOptions& options);

// Parses "islands=2,hosts_per_island=2,devices_per_host=4,device_memory=1GiB,
// executor_threads=2,control_latency_us=20,hang_report_seconds=60,
// ici_latency_us=1,ici_bandwidth_gbps=1600,dcn_latency_us=20,
// dcn_bandwidth_gbps=200,hosts=local_processes" (any subset, any order;
// hosts is a HostsModeName; memory is an integer with an optional unit B,
// KiB, MiB, GiB or TiB; bandwidths are in Gbit/s, 10^9 bits). The format
// of the PATHWAYS_TOPOLOGY environment variable. InvalidArgument names the
// bad key or value, and the limit for a value out of range.
absl::StatusOr<TopologyOptions> ParseTopology(absl::string_view spec);

// A size in bytes: an integer with an optional unit B, KiB, MiB, GiB or TiB,
// from 1 byte to 1TiB. InvalidArgument names `name` and the text.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text, absl::string_view name);

// The same from (key, value) pairs, each value parsed on its own as its key's
// type: what pw.configure passes, so a value cannot carry other keys.
absl::StatusOr<TopologyOptions> ParseTopology(
    const std::vector<std::pair<std::string, std::string>>& items);

class Device {
 public:
  int id() const { return id_; }                 // global, 0..num_devices-1
  int index_in_host() const { return index_in_host_; }
  int index_in_island() const { return index_in_island_; }
  const std::string& kind() const { return *kind_; }
  int64_t memory_capacity() const { return memory_capacity_; }
  Host* host() const { return host_; }
  Island* island() const { return island_; }
  // "TpuDevice(id=3, island=0, host=1)"
  std::string ToString() const;

  // Failure (fault injection, see Runtime::FailDevices; or its host process
  // was lost). A failed device stays failed, unless a new host process
  // takes its host's place (Runtime::ReplaceHost): work placed on it fails
  // with Unavailable, and buffers on it cannot be read (nor, after a
  // revival, those made before it: they went with the earlier process).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Marks the device failed for `why` (Unavailable; OK: "device N (island
  // I, host H) has failed"); false if it already was. Thread-safe.
  bool MarkFailed(absl::Status why = absl::OkStatus());
  // The device is healthy again: a new process serves its host, with its
  // memory empty, and the client's remote buffer ids below
  // `first_buffer_id` were the earlier process's (see first_buffer_id()).
  // False if it had not failed. Thread-safe.
  bool Revive(uint64_t first_buffer_id = 0);
  // A buffer with a remote id below this one was made on an earlier
  // process of the device's host, and went with it (0: never revived).
  uint64_t first_buffer_id() const { return first_buffer_id_.load(std::memory_order_acquire); }
  // Whether any device of this process was ever revived: until then no
  // buffer needs the check above (one load).
  static bool AnyRevived() { return any_revived_.load(std::memory_order_acquire); }
  // Why it failed (see MarkFailed); OK while it has not.
  absl::Status failure() const;

 private:
  friend class Cluster;
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> first_buffer_id_{0};
  static std::atomic<bool> any_revived_;
  mutable Mutex failure_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
  int id_ = 0, index_in_host_ = 0, index_in_island_ = 0;
  const std::string* kind_ = nullptr;
  int64_t memory_capacity_ = 0;
  Host* host_ = nullptr;
  Island* island_ = nullptr;
};

class Host {
 public:
  int id() const { return id_; }
  Island* island() const { return island_; }
  const std::vector<Device*>& devices() const { return devices_; }

 private:
  friend class Cluster;
  int id_ = 0;
  Island* island_ = nullptr;
  std::vector<Device*> devices_;
};

class Island {
 public:
  int id() const { return id_; }
  const std::vector<Host*>& hosts() const { return hosts_; }
  const std::vector<Device*>& devices() const { return devices_; }
  // How many of its devices have failed: 0 makes failure checks O(1).
  int num_failed() const { return num_failed_.load(std::memory_order_acquire); }

 private:
  friend class Cluster;
  friend class Device;
  std::atomic<int> num_failed_{0};
  int id_ = 0;
  std::vector<Host*> hosts_;
  std::vector<Device*> devices_;
};

class Cluster {
 public:
  // InvalidArgument unless ValidateTopology(options) is OK.
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(const TopologyOptions& options);

  const TopologyOptions& options() const { return options_; }
  const std::vector<Device*>& devices() const { return device_ptrs_; }
  const std::vector<Host*>& hosts() const { return host_ptrs_; }
  const std::vector<Island*>& islands() const { return island_ptrs_; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  // NotFound naming the valid range when `id` is not a device of this cluster.
  absl::StatusOr<Device*> device(int id) const;

 private:
  Cluster() = default;
  TopologyOptions options_;
  std::string kind_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::vector<std::unique_ptr<Island>> islands_;
  std::vector<Device*> device_ptrs_;
  std::vector<Host*> host_ptrs_;
  std::vector<Island*> island_ptrs_;
};

}  // namespace pw

#endif  // PATHWAYS_CLUSTER_CLUSTER_H_
