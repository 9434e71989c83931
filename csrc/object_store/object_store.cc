#include "csrc/object_store/object_store.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"

namespace pw {

ObjectStore::ObjectStore(const Host* host)
    : host_(host), memory_(new DeviceMemory[host->devices().size()]) {}

absl::Status ObjectStore::Reserve(const Device* device, int64_t bytes) {
  DeviceMemory& m = memory_[device->index_in_host()];
  // seq_cst (free on x86): see ObjectStores::NotifyMemoryWaiters.
  int64_t now = m.in_use.fetch_add(bytes, std::memory_order_seq_cst) + bytes;
  if (now > device->memory_capacity()) {
    m.in_use.fetch_sub(bytes, std::memory_order_seq_cst);
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
  memory_[device->index_in_host()].in_use.fetch_sub(bytes, std::memory_order_seq_cst);
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

absl::Status ObjectStores::Charge(const DeviceList* devices, int64_t bytes_per_device) {
  Arena* arena = ArenaFor(devices);
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
  return absl::OkStatus();
}

void ObjectStores::Discharge(const DeviceList* devices, int64_t bytes_per_device, bool notify) {
  Arena* arena = ArenaFor(devices);
  bool waiters = false;
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
    // Read under the arena's lock, which a waiter's retry of this arena
    // takes after it counted itself in (see NotifyMemoryWaiters).
    waiters = notify && waiters_.load(std::memory_order_seq_cst) > 0;
  }
  if (waiters) WakeMemoryWaiters();
}

absl::Status ObjectStores::Allocate(const DeviceList* devices, int64_t bytes_per_device) {
  absl::Status charged = Charge(devices, bytes_per_device);
  if (!charged.ok()) return charged;
  CountAllocated(devices, bytes_per_device);
  return absl::OkStatus();
}

void ObjectStores::CountAllocated(const DeviceList* devices, int64_t bytes_per_device) {
  live_bytes_.fetch_add(bytes_per_device * devices->size(), std::memory_order_relaxed);
  live_buffers_.fetch_add(1, std::memory_order_relaxed);
}

void ObjectStores::Free(const DeviceList* devices, int64_t bytes_per_device) {
  live_bytes_.fetch_sub(bytes_per_device * devices->size(), std::memory_order_relaxed);
  live_buffers_.fetch_sub(1, std::memory_order_relaxed);
  Discharge(devices, bytes_per_device);
}

void ObjectStores::NotifyMemoryWaiters() {
  // No fence is needed: a waiter counts itself in (seq_cst) before it
  // retries, and every release it could miss is ordered against that retry.
  // Memory in an arena is released under the arena's lock, which the retry
  // takes too (Discharge reads waiters_ inside it); device memory is
  // released by a seq_cst RMW on the device's counter, which the retry's
  // RMW on the same counter follows or precedes; work ends by a seq_cst
  // RMW on work_in_flight_ before this seq_cst load. So either the waiter
  // sees what was released, or this sees the waiter.
  if (waiters_.load(std::memory_order_seq_cst) == 0) return;
  WakeMemoryWaiters();
}

void ObjectStores::WakeMemoryWaiters() {
  MutexLock lock(&memory_mu_);
  ++memory_generation_;
  memory_cv_.SignalAll();
}

bool ObjectStores::AwaitMemoryEvent(uint64_t generation, int64_t timeout_ns) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  MutexLock lock(&memory_mu_);
  while (memory_generation_ == generation) {
    if (!memory_cv_.WaitUntil(&memory_mu_, deadline)) break;
  }
  return memory_generation_ != generation;
}

absl::Status ObjectStores::TryReserve(absl::Span<const MemoryRequest> requests, MemoryReservation* out) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].bytes_per_device == 0) continue;
    absl::Status s = Charge(requests[i].devices, requests[i].bytes_per_device);
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) {
        // Not a release: this only undoes the attempt (and must not wake the
        // waiters, this one included, into trying again at once).
        if (requests[j].bytes_per_device > 0) {
          Discharge(requests[j].devices, requests[j].bytes_per_device, /*notify=*/false);
        }
      }
      return s;
    }
  }
  out->Return();
  out->stores_ = this;
  out->left_.assign(requests.begin(), requests.end());
  return absl::OkStatus();
}

absl::Status ObjectStores::CheckCanEverFit(absl::Span<const MemoryRequest> requests, absl::string_view what) const {
  // Off the fast path: O(devices of the requests).
  absl::flat_hash_map<const Device*, int64_t> need;
  for (const MemoryRequest& r : requests) {
    for (const Device* d : r.devices->devices()) need[d] += r.bytes_per_device;
  }
  for (const MemoryRequest& r : requests) {  // the first such device, in order
    for (const Device* device : r.devices->devices()) {
      const int64_t bytes = need[device];
      if (bytes <= device->memory_capacity()) continue;
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of device memory on ", device->ToString(), ": '", what, "' needs ", bytes,
          " bytes there at once, more than the device's ", device->memory_capacity(), " bytes"));
    }
  }
  return absl::OkStatus();
}

namespace {
// How long memory must stay quiet, with nothing in flight, before a
// reservation that does not fit fails.
constexpr int64_t kQuietNs = 100'000'000;
}  // namespace

absl::StatusOr<MemoryReservation> ObjectStores::Reserve(absl::Span<const MemoryRequest> requests, Blocker* blocker,
                                                        absl::FunctionRef<absl::Status()> cancelled,
                                                        absl::string_view what) {
  MemoryReservation reservation;
  absl::Status status = TryReserve(requests, &reservation);
  if (status.ok() || status.code() != absl::StatusCode::kResourceExhausted) {
    if (!status.ok()) return status;
    return reservation;
  }
  if (absl::Status never = CheckCanEverFit(requests, what); !never.ok()) return never;
  // Back-pressure: wait for work in flight to free memory.
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    std::atomic<int>* waiters;
    ~Leave() { waiters->fetch_sub(1, std::memory_order_relaxed); }
  } leave{&waiters_};
  auto interrupted = [&] {
    return absl::CancelledError(absl::StrCat("'", what, "' was interrupted while it waited for device memory"));
  };
  for (;;) {
    uint64_t generation;
    {
      MutexLock lock(&memory_mu_);
      generation = memory_generation_;
    }
    status = TryReserve(requests, &reservation);
    if (status.ok()) return reservation;
    if (work_in_flight() == 0) {
      // Work that ended freed its buffers before it stopped counting: one
      // more try sees all of it.
      status = TryReserve(requests, &reservation);
      if (status.ok()) return reservation;
      // Only live buffers hold memory now. Another thread may be about to
      // drop some (say, between a call and the assignment of its result):
      // fail only once memory has stayed quiet for a while.
      const int64_t quiet_until = NowNanos() + kQuietNs;
      bool changed = false;
      const bool waited = blocker->Block([&](int64_t timeout_ns) {
        changed = AwaitMemoryEvent(generation, std::min(timeout_ns, quiet_until - NowNanos()));
        return changed || NowNanos() >= quiet_until;
      });
      if (!waited) return interrupted();
      if (changed || work_in_flight() > 0) continue;
      if (absl::Status stop = cancelled(); !stop.ok()) return stop;
      return absl::ResourceExhaustedError(absl::StrCat(
          status.message(), " (for '", what,
          "'); no work in flight is left to free memory: the rest is held by live buffers"));
    }
    if (absl::Status stop = cancelled(); !stop.ok()) return stop;
    const bool waited = blocker->Block([&](int64_t timeout_ns) { return AwaitMemoryEvent(generation, timeout_ns); });
    if (!waited) return interrupted();
  }
}

void ObjectStores::ListAccountSlow(const std::shared_ptr<MemoryAccount>& account) {
  MutexLock lock(&accounts_mu_);
  if (account->listed_by_.load(std::memory_order_relaxed) == this) return;
  // Listed by other stores before (tests run several runtimes): maybe here too.
  if (account->listed_by_.load(std::memory_order_relaxed) == nullptr ||
      std::find(accounts_.begin(), accounts_.end(), account) == accounts_.end()) {
    accounts_.push_back(account);
  }
  account->listed_by_.store(this, std::memory_order_release);
}

std::vector<std::shared_ptr<MemoryAccount>> ObjectStores::ProgramAccounts() {
  MutexLock lock(&accounts_mu_);
  // Only this list holds an account whose program is gone; once it holds
  // no buffers either, nothing can charge it again.
  accounts_.erase(std::remove_if(accounts_.begin(), accounts_.end(),
                                 [](const std::shared_ptr<MemoryAccount>& a) {
                                   return a.use_count() == 1 && a->live_buffers() == 0;
                                 }),
                  accounts_.end());
  return accounts_;
}

void MemoryAccount::Charge(int64_t bytes, int64_t buffers) {
  const int64_t now = bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  buffers_.fetch_add(buffers, std::memory_order_relaxed);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

MemoryReservation& MemoryReservation::operator=(MemoryReservation&& other) noexcept {
  if (this != &other) {
    Return();
    stores_ = other.stores_;
    left_ = std::move(other.left_);
    other.stores_ = nullptr;
    other.left_.clear();
  }
  return *this;
}

bool MemoryReservation::Take(const DeviceList* devices, int64_t bytes_per_device) {
  for (MemoryRequest& r : left_) {
    if (r.devices == devices && r.bytes_per_device >= bytes_per_device) {
      r.bytes_per_device -= bytes_per_device;
      return true;
    }
  }
  return false;
}

void MemoryReservation::Return() {
  if (stores_ == nullptr) return;
  for (const MemoryRequest& r : left_) {
    if (r.bytes_per_device > 0) stores_->Discharge(r.devices, r.bytes_per_device);
  }
  left_.clear();
  stores_ = nullptr;
}

int64_t ObjectStores::TotalBytesCharged() const {
  int64_t total = 0;
  for (Device* d : cluster_->devices()) total += stores_[d->host()->id()]->bytes_in_use(d);
  return total;
}

}  // namespace pw
