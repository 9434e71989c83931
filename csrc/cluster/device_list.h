#ifndef PATHWAYS_CLUSTER_DEVICE_LIST_H_
#define PATHWAYS_CLUSTER_DEVICE_LIST_H_

// An ordered list of distinct physical devices: shard i of a sharded buffer
// or gang lives on devices()[i]. Lists are interned by DeviceListRegistry, so
// two buffers are on the same devices exactly when their DeviceList pointers
// are equal: the dispatch path compares placements in O(1), not per shard.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "csrc/base/mutex.h"
#include "csrc/cluster/cluster.h"

namespace pw {

// "[0-3]" for a run of consecutive ids, "[0,1,8,9]" otherwise.
std::string DeviceIdsToString(const std::vector<int>& ids);

class DeviceList {
 public:
  const std::vector<Device*>& devices() const { return devices_; }
  int size() const { return static_cast<int>(devices_.size()); }
  Device* operator[](int i) const { return devices_[i]; }
  // The island of every device, or nullptr if they span several islands.
  Island* island() const { return island_; }
  // Compact text: "island 0 devices [0-3]" or "devices [0,1,8,9]".
  const std::string& ToString() const { return text_; }
  // Dense id, 0.. in order of interning (for per-list tables).
  int id() const { return id_; }

  // A failed device of the list (Device::failed()), or nullptr. O(1) while
  // its island has no failed device; a scan of the list otherwise.
  const Device* FailedDevice() const;
  // OK, or Unavailable naming the first failed device of the list: the
  // status of work placed on it and of reading buffers on it.
  absl::Status CheckHealthy() const;

 private:
  friend class DeviceListRegistry;
  int id_ = 0;
  std::vector<Device*> devices_;
  Island* island_ = nullptr;
  std::string text_;
};

// Interns DeviceLists. Thread-safe. Lists live as long as the registry.
class DeviceListRegistry {
 public:
  // At most this many distinct lists (ids are dense below it).
  static constexpr int kMaxLists = 1 << 16;

  // InvalidArgument if `devices` is empty or names a device twice;
  // ResourceExhausted past kMaxLists distinct lists.
  absl::StatusOr<const DeviceList*> Intern(absl::Span<Device* const> devices);

  // The device ids of the list with `id` (empty for an unknown id).
  std::vector<int> DeviceIds(int id);

 private:
  Mutex mu_;
  absl::flat_hash_map<std::vector<int>, std::unique_ptr<DeviceList>> lists_ ABSL_GUARDED_BY(mu_);
  std::vector<const DeviceList*> by_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_CLUSTER_DEVICE_LIST_H_
