#ifndef PATHWAYS_RESOURCE_MANAGER_RESOURCE_MANAGER_H_
#define PATHWAYS_RESOURCE_MANAGER_RESOURCE_MANAGER_H_

// The resource manager (paper §4.1): hands out virtual slices of an island.
// A VirtualSlice's virtual devices map one-to-one onto distinct physical
// devices of one island. Like the paper's initial heuristic, it balances load
// statically: a new slice goes to the least-loaded island that can hold it,
// onto that island's least-loaded devices (load = number of live virtual
// devices mapped to a device). Slices may share physical devices; the gang
// scheduler time-multiplexes them.
//
// Thread-safe. The ResourceManager must outlive every slice it hands out.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/cluster/cluster.h"
#include "csrc/cluster/device_list.h"

namespace pw {

class ResourceManager;

// The process-wide mapping generation: bumped by every remap of any slice
// (ResourceManager::Remap). A lowered program compares it with the one it
// was lowered at, one atomic load per run, and re-lowers only when a slice
// it uses has a new mapping (program_ir/lowering.h).
uint64_t MappingGeneration();

// A slice of an island: virtual device i is physical device devices()[i].
// The mapping changes only by ResourceManager::Remap (paper §4.1: virtual
// devices are re-mapped onto other physical devices when some fail), which
// bumps epoch(); programs that use the slice re-lower at their next run.
class VirtualSlice : public std::enable_shared_from_this<VirtualSlice> {
 public:
  ~VirtualSlice();
  int id() const { return id_; }
  int size() const { return devices()->size(); }
  // The physical devices now, interned: equal slices' lists compare equal.
  const DeviceList* devices() const { return devices_.load(std::memory_order_acquire); }
  Island* island() const { return devices()->island(); }
  // How many times the slice was remapped.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  std::string ToString() const;

 private:
  friend class ResourceManager;
  VirtualSlice(ResourceManager* rm, int id, const DeviceList* devices)
      : rm_(rm), id_(id), devices_(devices) {}
  ResourceManager* rm_;
  int id_;
  std::atomic<const DeviceList*> devices_;
  std::atomic<uint64_t> epoch_{0};
};

// What one remap did (ResourceManager::Remap).
struct RemapResult {
  int slice = 0;
  const DeviceList* before = nullptr;
  const DeviceList* after = nullptr;
  // Indices of the virtual devices whose physical device changed.
  std::vector<int> moved;
};

// Virtual device `index` of `slice`. Holding one keeps the slice alive.
struct VirtualDevice {
  std::shared_ptr<VirtualSlice> slice;
  int index = 0;

  Device* physical() const { return slice->devices()->devices()[index]; }
  // "VirtualDevice(slice=2, index=0, TpuDevice(id=3, island=0, host=0))"
  std::string ToString() const;
};

class ResourceManager {
 public:
  // `cluster` and `registry` must outlive the ResourceManager.
  ResourceManager(const Cluster* cluster, DeviceListRegistry* registry);

  // A slice of `num_devices` devices of `kind` on one island.
  // InvalidArgument for num_devices < 1 or > kMaxDevices (more than any
  // topology has); NotFound for an unknown kind; ResourceExhausted when no
  // island has that many devices; each message names what was asked and
  // what the cluster has.
  absl::StatusOr<std::shared_ptr<VirtualSlice>> AddSlice(int64_t num_devices, absl::string_view kind);

  // Gives out only these devices from now on (a tenant's grant from its
  // service: service/service.h, "Quotas"); ids of the cluster's devices.
  void Restrict(const std::vector<int>& device_ids);
  // The devices it gives out, by id: every device unless Restrict()ed.
  std::vector<int> UsableDevices() const;

  // Re-maps `slice` (paper §4.1) so that none of its virtual devices is on a
  // failed device: each one on a failed device moves to a healthy device of
  // the same island that the slice does not use, the least-loaded first
  // (ties: lowest id); the others stay. If the island has too few, the whole
  // slice moves to the least-loaded island with enough, as AddSlice would
  // place it. With `spare_only`, only spare devices count: devices no live
  // slice uses (else the slice may share devices with others, as AddSlice's
  // do). Nothing moves when no device of it has failed (`moved` empty).
  // ResourceExhausted, naming the slice and what each island has, when no
  // island can hold it; the slice is unchanged then. Buffers stay where they
  // are: a remap moves where the slice's functions run from now on (their
  // programs re-lower), not data.
  absl::StatusOr<RemapResult> Remap(VirtualSlice* slice, bool spare_only = true);

  // The live slices with a virtual device on a failed device, by id.
  std::vector<std::shared_ptr<VirtualSlice>> SlicesOnFailedDevices() const;

  // Live virtual devices mapped to each physical device, by device id.
  std::vector<int> DeviceLoads() const;

  const Cluster& cluster() const { return *cluster_; }
  DeviceListRegistry* registry() const { return registry_; }

 private:
  friend class VirtualSlice;
  void Release(VirtualSlice* slice);
  // Usable: healthy, within the restriction, and (`spare_only`) unloaded.
  bool UsableLocked(const Device* d, bool spare_only = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int UsableCountLocked(const Island* island, bool spare_only = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The least-loaded island with `n` usable devices (ties: lowest id), or null.
  Island* LeastLoadedIslandLocked(int64_t n, bool spare_only = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `n` usable devices of `island` not in `exclude`, the least-loaded first.
  std::vector<Device*> LeastLoadedDevicesLocked(const Island* island, int64_t n, const std::vector<Device*>& exclude,
                                                bool spare_only = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Cluster* cluster_;
  DeviceListRegistry* registry_;
  mutable Mutex mu_;
  std::vector<int> load_ ABSL_GUARDED_BY(mu_);  // by device id
  std::vector<bool> usable_ ABSL_GUARDED_BY(mu_);  // by device id; empty: all
  int next_slice_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<VirtualSlice*> slices_ ABSL_GUARDED_BY(mu_);  // live, by creation
};

}  // namespace pw

#endif  // PATHWAYS_RESOURCE_MANAGER_RESOURCE_MANAGER_H_
