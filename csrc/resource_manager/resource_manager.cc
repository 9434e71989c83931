#include "csrc/resource_manager/resource_manager.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {
namespace {

std::atomic<uint64_t> mapping_generation{0};

}  // namespace

uint64_t MappingGeneration() { return mapping_generation.load(std::memory_order_acquire); }

VirtualSlice::~VirtualSlice() { rm_->Release(this); }

std::string VirtualSlice::ToString() const {
  const DeviceList* list = devices();
  return absl::StrCat("VirtualSlice(id=", id_, ", ", list->size(), " x ", list->devices()[0]->kind(), " on ",
                      list->ToString(), ")");
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
  Island* best = LeastLoadedIslandLocked(num_devices);
  if (best == nullptr) {
    std::vector<std::string> sizes;
    for (Island* island : cluster_->islands()) {
      sizes.push_back(absl::StrCat("island ", island->id(), ": ", UsableCountLocked(island),
                                   island->num_failed() > 0 ? " healthy" : ""));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "add_slice(", kind, "_devices=", num_devices, "): no island has ", num_devices, " ", kind,
        usable_.empty() ? " devices" : " devices of this tenant's",
        " (a slice lives on one island; ", absl::StrJoin(sizes, ", "), ")",
        usable_.empty() ? "" : "; pw.configure(devices=...) asks the service for more"));
  }
  // In id order, so that slices of a host's size line up with hosts.
  std::vector<Device*> candidates = LeastLoadedDevicesLocked(best, num_devices, {});
  std::sort(candidates.begin(), candidates.end(), [](Device* a, Device* b) { return a->id() < b->id(); });
  auto list = registry_->Intern(candidates);
  if (!list.ok()) return list.status();
  for (Device* d : candidates) ++load_[d->id()];
  auto slice = std::shared_ptr<VirtualSlice>(new VirtualSlice(this, next_slice_id_++, *list));
  slices_.push_back(slice.get());
  return slice;
}

// Failed devices (fault injection, or a lost host's) are never given out,
// nor devices outside a restriction.
bool ResourceManager::UsableLocked(const Device* d, bool spare_only) const {
  return !d->failed() && (usable_.empty() || usable_[d->id()]) && (!spare_only || load_[d->id()] == 0);
}

int ResourceManager::UsableCountLocked(const Island* island, bool spare_only) const {
  if (usable_.empty() && !spare_only) return static_cast<int>(island->devices().size()) - island->num_failed();
  int n = 0;
  for (const Device* d : island->devices()) n += UsableLocked(d, spare_only) ? 1 : 0;
  return n;
}

Island* ResourceManager::LeastLoadedIslandLocked(int64_t n, bool spare_only) const {
  Island* best = nullptr;
  int64_t best_load = 0;
  for (Island* island : cluster_->islands()) {
    if (UsableCountLocked(island, spare_only) < n) continue;
    int64_t total = 0;
    for (Device* d : island->devices()) total += load_[d->id()];
    if (best == nullptr || total < best_load) {
      best = island;
      best_load = total;
    }
  }
  return best;
}

std::vector<Device*> ResourceManager::LeastLoadedDevicesLocked(const Island* island, int64_t n,
                                                               const std::vector<Device*>& exclude,
                                                               bool spare_only) const {
  std::vector<std::pair<int, Device*>> by_load;  // (load, device), in id order
  for (Device* d : island->devices()) {
    if (UsableLocked(d, spare_only) && std::find(exclude.begin(), exclude.end(), d) == exclude.end()) {
      by_load.emplace_back(load_[d->id()], d);
    }
  }
  std::stable_sort(by_load.begin(), by_load.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Device*> out;
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(by_load.size()); ++i) out.push_back(by_load[i].second);
  return out;
}

absl::StatusOr<RemapResult> ResourceManager::Remap(VirtualSlice* slice, bool spare_only) {
  MutexLock lock(&mu_);
  RemapResult result;
  result.slice = slice->id();
  result.before = slice->devices();
  result.after = result.before;
  const std::vector<Device*>& before = result.before->devices();
  std::vector<int> failed;
  for (int i = 0; i < static_cast<int>(before.size()); ++i) {
    if (before[i]->failed()) failed.push_back(i);
  }
  if (failed.empty()) return result;
  std::vector<Device*> after = before;
  const Island* island = result.before->island();
  std::vector<Device*> spares =
      LeastLoadedDevicesLocked(island, static_cast<int64_t>(failed.size()), before, spare_only);
  if (spares.size() == failed.size()) {
    // Spares of the same island, lowest ids to the lowest indices.
    std::sort(spares.begin(), spares.end(), [](Device* a, Device* b) { return a->id() < b->id(); });
    for (size_t k = 0; k < failed.size(); ++k) after[failed[k]] = spares[k];
  } else {
    // The whole slice moves: its functions run on one island. Its own
    // load does not count against the move (its healthy devices are spare
    // for it), here and in the message.
    for (Device* d : before) --load_[d->id()];
    Island* best = LeastLoadedIslandLocked(static_cast<int64_t>(before.size()), spare_only);
    std::string why;
    if (best != nullptr) {
      after = LeastLoadedDevicesLocked(best, static_cast<int64_t>(before.size()), {}, spare_only);
      std::sort(after.begin(), after.end(), [](Device* a, Device* b) { return a->id() < b->id(); });
    } else {
      std::vector<std::string> sizes;
      for (Island* i : cluster_->islands()) {
        sizes.push_back(absl::StrCat("island ", i->id(), ": ", UsableCountLocked(i), " healthy",
                                     spare_only ? absl::StrCat(", ", UsableCountLocked(i, true), " spare") : ""));
      }
      why = absl::StrCat("remap of slice ", slice->id(), " (", before.size(), " devices, ", failed.size(),
                         " of them failed): no island has ", before.size(), spare_only ? " spare" : " healthy",
                         " devices", usable_.empty() ? "" : " of this tenant's", " for it (",
                         absl::StrJoin(sizes, ", "), ")",
                         spare_only ? "; devices other slices use are not spare" : "");
    }
    for (Device* d : before) ++load_[d->id()];
    if (best == nullptr) return absl::ResourceExhaustedError(why);
  }
  auto list = registry_->Intern(after);
  if (!list.ok()) return list.status();
  for (Device* d : before) --load_[d->id()];
  for (Device* d : after) ++load_[d->id()];
  for (int i = 0; i < static_cast<int>(before.size()); ++i) {
    if (before[i] != after[i]) result.moved.push_back(i);
  }
  result.after = *list;
  slice->devices_.store(*list, std::memory_order_release);
  slice->epoch_.fetch_add(1, std::memory_order_acq_rel);
  mapping_generation.fetch_add(1, std::memory_order_acq_rel);
  return result;
}

std::vector<std::shared_ptr<VirtualSlice>> ResourceManager::SlicesOnFailedDevices() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<VirtualSlice>> out;
  for (VirtualSlice* s : slices_) {
    const auto& devices = s->devices()->devices();
    if (std::none_of(devices.begin(), devices.end(), [](const Device* d) { return d->failed(); })) continue;
    if (auto live = s->weak_from_this().lock()) out.push_back(std::move(live));
  }
  return out;
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

void ResourceManager::Release(VirtualSlice* slice) {
  MutexLock lock(&mu_);
  for (Device* d : slice->devices()->devices()) --load_[d->id()];
  slices_.erase(std::find(slices_.begin(), slices_.end(), slice));
}

}  // namespace pw
