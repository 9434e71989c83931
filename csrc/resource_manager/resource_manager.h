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

// A slice of an island: virtual device i is physical device devices()[i].
// Immutable; the mapping never changes in this version (remapping would bump
// a mapping epoch and force re-lowering of programs that use the slice).
class VirtualSlice {
 public:
  ~VirtualSlice();
  int id() const { return id_; }
  int size() const { return devices_->size(); }
  // The physical devices, interned: equal slices' lists compare equal.
  const DeviceList* devices() const { return devices_; }
  Island* island() const { return devices_->island(); }
  std::string ToString() const;

 private:
  friend class ResourceManager;
  VirtualSlice(ResourceManager* rm, int id, const DeviceList* devices)
      : rm_(rm), id_(id), devices_(devices) {}
  ResourceManager* rm_;
  int id_;
  const DeviceList* devices_;
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

  // Live virtual devices mapped to each physical device, by device id.
  std::vector<int> DeviceLoads() const;

  const Cluster& cluster() const { return *cluster_; }
  DeviceListRegistry* registry() const { return registry_; }

 private:
  friend class VirtualSlice;
  void Release(const DeviceList* devices);

  const Cluster* cluster_;
  DeviceListRegistry* registry_;
  mutable Mutex mu_;
  std::vector<int> load_ ABSL_GUARDED_BY(mu_);  // by device id
  std::vector<bool> usable_ ABSL_GUARDED_BY(mu_);  // by device id; empty: all
  int next_slice_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pw

#endif  // PATHWAYS_RESOURCE_MANAGER_RESOURCE_MANAGER_H_
