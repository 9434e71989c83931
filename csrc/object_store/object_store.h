#ifndef PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_
#define PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_

// The per-host object store (paper §4.6): tracks the device memory (HBM) of
// the host's devices. Every shard of every sharded buffer is charged to its
// device here; an allocation that does not fit fails with ResourceExhausted
// instead of overcommitting host memory.
//
// Thread-safe and lock-free: each device's usage is an atomic counter.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "csrc/cluster/cluster.h"

namespace pw {

class ObjectStore {
 public:
  explicit ObjectStore(const Host* host);

  const Host* host() const { return host_; }

  // Charges `bytes` to `device` (a device of this host). ResourceExhausted,
  // naming the device, the request and what is free, if it does not fit.
  absl::Status Reserve(const Device* device, int64_t bytes);
  void Release(const Device* device, int64_t bytes);

  int64_t bytes_in_use(const Device* device) const;
  int64_t peak_bytes_in_use(const Device* device) const;
  // Live sharded buffers with at least one shard on this host.
  int64_t live_buffers() const { return live_buffers_.load(std::memory_order_relaxed); }
  void AddLiveBuffer(int64_t delta) { live_buffers_.fetch_add(delta, std::memory_order_relaxed); }

 private:
  struct DeviceMemory {
    std::atomic<int64_t> in_use{0};
    std::atomic<int64_t> peak{0};
  };
  const Host* host_;
  std::unique_ptr<DeviceMemory[]> memory_;  // by Device::index_in_host()
  std::atomic<int64_t> live_buffers_{0};
};

// The object stores of all hosts of a cluster, indexed by host id.
class ObjectStores {
 public:
  explicit ObjectStores(const Cluster* cluster);
  ObjectStore& For(const Device* device) { return *stores_[device->host()->id()]; }
  ObjectStore& host(int host_id) { return *stores_[host_id]; }
  // Total bytes in use over all devices (for tests and stats).
  int64_t TotalBytesInUse() const;

 private:
  const Cluster* cluster_;
  std::vector<std::unique_ptr<ObjectStore>> stores_;
};

}  // namespace pw

#endif  // PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_
