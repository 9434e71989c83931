#include "csrc/object_store/object_store.h"

#include <algorithm>

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

// Memory reserved on every device of one list, handed out to that list's
// buffers. Per device: `reserved` is charged to the device's object store,
// `used` is what live buffers take of it.
struct ObjectStores::Arena {
  const DeviceList* devices = nullptr;
  int64_t chunk = 1;  // growth and hysteresis step, per device
  Mutex mu;
  int64_t reserved ABSL_GUARDED_BY(mu) = 0;
  int64_t used ABSL_GUARDED_BY(mu) = 0;
};

ObjectStores::ObjectStores(const Cluster* cluster)
    : cluster_(cluster), arenas_(new std::atomic<Arena*>[DeviceListRegistry::kMaxLists]) {
  for (Host* host : cluster->hosts()) stores_.push_back(std::make_unique<ObjectStore>(host));
  for (int i = 0; i < DeviceListRegistry::kMaxLists; ++i) arenas_[i].store(nullptr, std::memory_order_relaxed);
}

ObjectStores::~ObjectStores() {
  for (int i = 0; i < DeviceListRegistry::kMaxLists; ++i) delete arenas_[i].load(std::memory_order_relaxed);
}

ObjectStores::Arena* ObjectStores::ArenaFor(const DeviceList* devices) {
  std::atomic<Arena*>& slot = arenas_[devices->id()];
  Arena* arena = slot.load(std::memory_order_acquire);
  if (arena != nullptr) return arena;
  MutexLock lock(&arenas_mu_);
  arena = slot.load(std::memory_order_acquire);
  if (arena == nullptr) {
    arena = new Arena();
    arena->devices = devices;
    // Small next to the device, so slack never matters; 1 byte (exact
    // accounting) for tiny test devices.
    arena->chunk = std::clamp<int64_t>(devices->devices()[0]->memory_capacity() / 256, 1, 64 << 10);
    all_arenas_.push_back(arena);
    slot.store(arena, std::memory_order_release);
  }
  return arena;
}

int64_t ObjectStores::LiveBytesOn(const Device* device) {
  std::vector<Arena*> arenas;
  {
    MutexLock lock(&arenas_mu_);
    arenas = all_arenas_;
  }
  int64_t live = 0;
  for (Arena* arena : arenas) {
    bool on_device = false;
    for (Device* d : arena->devices->devices()) on_device |= d == device;
    if (!on_device) continue;
    MutexLock lock(&arena->mu);
    live += arena->used;
  }
  return live;
}

absl::Status ObjectStores::Allocate(const DeviceList* devices, int64_t bytes_per_device) {
  Arena* arena = ArenaFor(devices);
  {
    MutexLock lock(&arena->mu);
    if (arena->used + bytes_per_device > arena->reserved) {
      // Grow the reservation on every device: O(devices), once per chunk.
      const int64_t grow = std::max(arena->used + bytes_per_device - arena->reserved, arena->chunk);
      const auto& devs = devices->devices();
      for (size_t i = 0; i < devs.size(); ++i) {
        absl::Status s = For(devs[i]).Reserve(devs[i], grow);
        if (!s.ok()) {
          for (size_t j = 0; j < i; ++j) For(devs[j]).Release(devs[j], grow);
          return s;
        }
      }
      arena->reserved += grow;
    }
    arena->used += bytes_per_device;
  }
  live_bytes_.fetch_add(bytes_per_device * devices->size(), std::memory_order_relaxed);
  live_buffers_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void ObjectStores::Free(const DeviceList* devices, int64_t bytes_per_device) {
  Arena* arena = ArenaFor(devices);
  {
    MutexLock lock(&arena->mu);
    arena->used -= bytes_per_device;
    // Give back what is more than two chunks of slack, keeping one.
    if (arena->reserved - arena->used > 2 * arena->chunk) {
      const int64_t target = arena->used + arena->chunk;
      const int64_t give = arena->reserved - target;
      for (Device* d : devices->devices()) For(d).Release(d, give);
      arena->reserved = target;
    }
  }
  live_bytes_.fetch_sub(bytes_per_device * devices->size(), std::memory_order_relaxed);
  live_buffers_.fetch_sub(1, std::memory_order_relaxed);
}

int64_t ObjectStores::TotalBytesCharged() const {
  int64_t total = 0;
  for (Device* d : cluster_->devices()) total += stores_[d->host()->id()]->bytes_in_use(d);
  return total;
}

}  // namespace pw
