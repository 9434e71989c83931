#ifndef PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_
#define PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_

// The per-host object store (paper §4.6): tracks the device memory (HBM) of
// the host's devices. Every shard of every sharded buffer is charged to its
// device; an allocation that does not fit fails with ResourceExhausted
// instead of overcommitting host memory.
//
// ObjectStores (all hosts) charges sharded buffers through one arena per
// device list, so that allocating a buffer over 2048 devices costs O(1): the
// arena reserves memory on each of its devices in chunks (O(devices), rarely)
// and hands out allocations from that reservation. A device's bytes_in_use
// is what is charged to it, reservations included; TotalLiveBytes counts
// only live buffers.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "csrc/base/mutex.h"
#include "csrc/cluster/cluster.h"
#include "csrc/cluster/device_list.h"

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

 private:
  struct DeviceMemory {
    std::atomic<int64_t> in_use{0};
    std::atomic<int64_t> peak{0};
  };
  const Host* host_;
  std::unique_ptr<DeviceMemory[]> memory_;  // by Device::index_in_host()
};

// The object stores of all hosts of a cluster, and the per-device-list arenas.
class ObjectStores {
 public:
  explicit ObjectStores(const Cluster* cluster);
  ~ObjectStores();

  ObjectStore& For(const Device* device) { return *stores_[device->host()->id()]; }
  ObjectStore& host(int host_id) { return *stores_[host_id]; }

  // Charges `bytes_per_device` on every device of `devices` for one buffer.
  // ResourceExhausted if a device is full; nothing stays charged then.
  absl::Status Allocate(const DeviceList* devices, int64_t bytes_per_device);
  void Free(const DeviceList* devices, int64_t bytes_per_device);

  // Bytes of live sharded buffers, and their number.
  int64_t TotalLiveBytes() const { return live_bytes_.load(std::memory_order_relaxed); }
  int64_t live_buffers() const { return live_buffers_.load(std::memory_order_relaxed); }
  // Bytes charged to all devices, arena reservations included.
  int64_t TotalBytesCharged() const;
  // Bytes of live buffers' shards on `device` (O(device lists), for stats).
  int64_t LiveBytesOn(const Device* device);

 private:
  struct Arena;
  Arena* ArenaFor(const DeviceList* devices);

  const Cluster* cluster_;
  std::vector<std::unique_ptr<ObjectStore>> stores_;
  std::unique_ptr<std::atomic<Arena*>[]> arenas_;  // by DeviceList::id()
  Mutex arenas_mu_;                                // serializes arena creation
  std::vector<Arena*> all_arenas_ ABSL_GUARDED_BY(arenas_mu_);
  std::atomic<int64_t> live_bytes_{0};
  std::atomic<int64_t> live_buffers_{0};
};

}  // namespace pw

#endif  // PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_
