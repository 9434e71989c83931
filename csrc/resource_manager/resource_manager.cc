#include "csrc/resource_manager/resource_manager.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

VirtualSlice::~VirtualSlice() { rm_->Release(devices_); }

std::string VirtualSlice::ToString() const {
  return absl::StrCat("VirtualSlice(id=", id_, ", ", size(), " x ", devices_->devices()[0]->kind(),
                      " on ", devices_->ToString(), ")");
}

std::string VirtualDevice::ToString() const {
  return absl::StrCat("VirtualDevice(slice=", slice->id(), ", index=", index, ", ", physical()->ToString(), ")");
}

ResourceManager::ResourceManager(const Cluster* cluster, DeviceListRegistry* registry)
    : cluster_(cluster), registry_(registry), load_(cluster->num_devices(), 0) {}

absl::StatusOr<std::shared_ptr<VirtualSlice>> ResourceManager::AddSlice(int64_t num_devices,
                                                                        absl::string_view kind) {
  const std::string& have_kind = cluster_->options().device_kind;
  if (kind != have_kind) {
    return absl::NotFoundError(
        absl::StrCat("unknown device kind '", kind, "'; this cluster has: ", have_kind));
  }
  if (num_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("add_slice(", kind, "_devices=", num_devices, "): a slice needs at least one device"));
  }
  if (num_devices > kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("add_slice(", kind, "_devices=", num_devices,
                                                   "): a slice has at most ", kMaxDevices,
                                                   " devices, the most a topology has"));
  }
  MutexLock lock(&mu_);
  // Least-loaded island with enough healthy devices; ties go to the lower id.
  // Failed devices (fault injection) are never given out, nor devices
  // outside a restriction.
  auto usable = [&](const Device* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !d->failed() && (usable_.empty() || usable_[d->id()]);
  };
  auto healthy = [&](const Island* island) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (usable_.empty()) return static_cast<int>(island->devices().size()) - island->num_failed();
    int n = 0;
    for (const Device* d : island->devices()) n += usable(d) ? 1 : 0;
    return n;
  };
  Island* best = nullptr;
  int64_t best_load = 0;
  for (Island* island : cluster_->islands()) {
    if (healthy(island) < num_devices) continue;
    int64_t total = 0;
    for (Device* d : island->devices()) total += load_[d->id()];
    if (best == nullptr || total < best_load) {
      best = island;
      best_load = total;
    }
  }
  if (best == nullptr) {
    std::vector<std::string> sizes;
    for (Island* island : cluster_->islands()) {
      sizes.push_back(absl::StrCat("island ", island->id(), ": ", healthy(island),
                                   island->num_failed() > 0 ? " healthy" : ""));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "add_slice(", kind, "_devices=", num_devices, "): no island has ", num_devices, " ", kind,
        usable_.empty() ? " devices" : " devices of this tenant's",
        " (a slice lives on one island; ", absl::StrJoin(sizes, ", "), ")",
        usable_.empty() ? "" : "; pw.configure(devices=...) asks the service for more"));
  }
  // Least-loaded devices of that island, in id order among equals, so that
  // slices of a host's size line up with hosts.
  std::vector<std::pair<int, Device*>> by_load;  // (load, device) of the healthy devices
  for (Device* d : best->devices()) {
    if (usable(d)) by_load.emplace_back(load_[d->id()], d);
  }
  std::stable_sort(by_load.begin(), by_load.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Device*> candidates;
  for (int i = 0; i < num_devices; ++i) candidates.push_back(by_load[i].second);
  std::sort(candidates.begin(), candidates.end(), [](Device* a, Device* b) { return a->id() < b->id(); });
  auto list = registry_->Intern(candidates);
  if (!list.ok()) return list.status();
  for (Device* d : candidates) ++load_[d->id()];
  return std::shared_ptr<VirtualSlice>(new VirtualSlice(this, next_slice_id_++, *list));
}

void ResourceManager::Restrict(const std::vector<int>& device_ids) {
  MutexLock lock(&mu_);
  usable_.assign(load_.size(), false);
  for (int d : device_ids) {
    if (d >= 0 && d < static_cast<int>(usable_.size())) usable_[d] = true;
  }
}

std::vector<int> ResourceManager::UsableDevices() const {
  MutexLock lock(&mu_);
  std::vector<int> out;
  for (int d = 0; d < static_cast<int>(load_.size()); ++d) {
    if (usable_.empty() || usable_[d]) out.push_back(d);
  }
  return out;
}

std::vector<int> ResourceManager::DeviceLoads() const {
  MutexLock lock(&mu_);
  return load_;
}

void ResourceManager::Release(const DeviceList* devices) {
  MutexLock lock(&mu_);
  for (Device* d : devices->devices()) --load_[d->id()];
}

}  // namespace pw
