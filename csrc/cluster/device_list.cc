#include "csrc/cluster/device_list.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

std::string DeviceIdsToString(const std::vector<int>& ids) {
  bool consecutive = true;
  for (size_t i = 1; i < ids.size(); ++i) consecutive &= ids[i] == ids[i - 1] + 1;
  if (consecutive && ids.size() > 2) return absl::StrCat("[", ids.front(), "-", ids.back(), "]");
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

absl::StatusOr<const DeviceList*> DeviceListRegistry::Intern(absl::Span<Device* const> devices) {
  if (devices.empty()) return absl::InvalidArgumentError("a device list needs at least one device");
  std::vector<int> ids;
  ids.reserve(devices.size());
  for (Device* d : devices) ids.push_back(d->id());
  MutexLock lock(&mu_);
  auto it = lists_.find(ids);
  if (it != lists_.end()) return it->second.get();
  absl::flat_hash_map<int, int> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [pos, inserted] = seen.emplace(ids[i], static_cast<int>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("device ", ids[i], " appears twice (positions ",
                                                     pos->second, " and ", i, ") in one device list"));
    }
  }
  if (lists_.size() >= static_cast<size_t>(kMaxLists)) {
    return absl::ResourceExhaustedError(absl::StrCat("more than ", kMaxLists, " distinct device lists"));
  }
  auto list = std::make_unique<DeviceList>();
  list->id_ = static_cast<int>(lists_.size());
  list->devices_.assign(devices.begin(), devices.end());
  list->island_ = devices[0]->island();
  for (Device* d : devices) {
    if (d->island() != list->island_) list->island_ = nullptr;
  }
  list->text_ = list->island_ ? absl::StrCat("island ", list->island_->id(), " devices ", DeviceIdsToString(ids))
                              : absl::StrCat("devices ", DeviceIdsToString(ids));
  const DeviceList* result = list.get();
  by_id_.push_back(result);
  lists_.emplace(std::move(ids), std::move(list));
  return result;
}

const Device* DeviceList::FailedDevice() const {
  if (island_ != nullptr && island_->num_failed() == 0) return nullptr;
  for (const Device* d : devices_) {
    if (d->failed()) return d;
  }
  return nullptr;
}

absl::Status DeviceList::CheckHealthy() const {
  const Device* failed = FailedDevice();
  return failed == nullptr ? absl::OkStatus() : failed->failure();
}

std::vector<int> DeviceListRegistry::DeviceIds(int id) {
  MutexLock lock(&mu_);
  std::vector<int> ids;
  if (id < 0 || id >= static_cast<int>(by_id_.size())) return ids;
  for (Device* d : by_id_[id]->devices()) ids.push_back(d->id());
  return ids;
}

}  // namespace pw
