#include "csrc/object_store/object_store.h"

#include "absl/strings/str_cat.h"

namespace pw {

ObjectStore::ObjectStore(const Host* host)
    : host_(host), memory_(new DeviceMemory[host->devices().size()]) {}

absl::Status ObjectStore::Reserve(const Device* device, int64_t bytes) {
  DeviceMemory& m = memory_[device->index_in_host()];
  int64_t now = m.in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (now > device->memory_capacity()) {
    m.in_use.fetch_sub(bytes, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of device memory on ", device->ToString(), ": requested ", bytes, " bytes, ",
        device->memory_capacity() - (now - bytes), " of ", device->memory_capacity(), " bytes free"));
  }
  int64_t peak = m.peak.load(std::memory_order_relaxed);
  while (now > peak && !m.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return absl::OkStatus();
}

void ObjectStore::Release(const Device* device, int64_t bytes) {
  memory_[device->index_in_host()].in_use.fetch_sub(bytes, std::memory_order_relaxed);
}

int64_t ObjectStore::bytes_in_use(const Device* device) const {
  return memory_[device->index_in_host()].in_use.load(std::memory_order_relaxed);
}

int64_t ObjectStore::peak_bytes_in_use(const Device* device) const {
  return memory_[device->index_in_host()].peak.load(std::memory_order_relaxed);
}

ObjectStores::ObjectStores(const Cluster* cluster) : cluster_(cluster) {
  for (Host* host : cluster->hosts()) stores_.push_back(std::make_unique<ObjectStore>(host));
}

int64_t ObjectStores::TotalBytesInUse() const {
  int64_t total = 0;
  for (Device* d : cluster_->devices()) total += stores_[d->host()->id()]->bytes_in_use(d);
  return total;
}

}  // namespace pw
