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
// Back-pressure (§4.6): a dispatch reserves all the memory of its program at
// once (Reserve). When that does not fit but work in flight (WorkInFlight:
// dispatched gangs and transfers, which hold buffers) may still free some,
// the dispatching thread waits, and is woken whenever memory is freed or
// work ends; it fails with ResourceExhausted only when the program can never
// fit: it needs more than a device has, or nothing left in flight can free
// what it needs.
//
// Ownership labels (§4.6): every buffer is charged to the MemoryAccount of
// its client and of its program, so memory can be reported by owner.
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "csrc/base/blocker.h"
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

class ObjectStores;

// An owner of buffers (a client or a program): what its live buffers hold,
// over all their shards. Thread-safe.
class MemoryAccount {
 public:
  explicit MemoryAccount(std::string name) : name_(std::move(name)) {}
  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  const std::string& name() const { return name_; }
  // `bytes` over `buffers` buffers made, or gone.
  void Charge(int64_t bytes, int64_t buffers = 1);
  void Discharge(int64_t bytes, int64_t buffers = 1) {
    bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    buffers_.fetch_sub(buffers, std::memory_order_relaxed);
  }
  int64_t live_bytes() const { return bytes_.load(std::memory_order_relaxed); }
  int64_t live_buffers() const { return buffers_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }

 private:
  friend class ObjectStores;
  const std::string name_;
  std::atomic<int64_t> bytes_{0}, buffers_{0}, peak_{0};
  std::atomic<const ObjectStores*> listed_by_{nullptr};  // see ObjectStores::ListAccount
};

// `bytes_per_device` on every device of `devices`.
struct MemoryRequest {
  const DeviceList* devices = nullptr;
  int64_t bytes_per_device = 0;
};

// Device memory taken for one dispatch, all at once, before any of it is
// used (ObjectStores::Reserve): a program gets all its buffers or none, and
// never waits for memory half-dispatched. Buffers draw from it
// (ShardedBuffer::Allocate); what is not drawn goes back when it is
// destroyed. Movable; used by one thread.
class MemoryReservation {
 public:
  MemoryReservation() = default;
  MemoryReservation(MemoryReservation&& other) noexcept { *this = std::move(other); }
  MemoryReservation& operator=(MemoryReservation&& other) noexcept;
  ~MemoryReservation() { Return(); }

  // Takes `bytes_per_device` on `devices` from what is reserved; false if
  // nothing reserved for that list is left.
  bool Take(const DeviceList* devices, int64_t bytes_per_device);

 private:
  friend class ObjectStores;
  void Return();
  ObjectStores* stores_ = nullptr;
  absl::InlinedVector<MemoryRequest, 4> left_;
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
  // Counts a buffer drawn from a reservation (its memory is charged already).
  void CountAllocated(const DeviceList* devices, int64_t bytes_per_device);
  void Free(const DeviceList* devices, int64_t bytes_per_device);

  // Reserves every request at once (a list may appear more than once; they
  // add up). When that does not fit and work is in flight, waits through
  // `blocker` until memory is freed or work ends, and tries again.
  // ResourceExhausted, naming the device, when it can never fit: the
  // requests need more than a device's capacity, or nothing is left in
  // flight to free memory. Cancelled if the blocker gives up; the error of
  // `cancelled()` as soon as that is not OK (checked before each wait and
  // after each wake-up). `what` names the program in errors.
  absl::StatusOr<MemoryReservation> Reserve(absl::Span<const MemoryRequest> requests, Blocker* blocker,
                                            absl::FunctionRef<absl::Status()> cancelled, absl::string_view what);

  // A piece of work in flight that holds buffers (a dispatched gang or
  // transfer), from construction to destruction: memory waiters wait while
  // there is any. Declare it as the first member of the work's object, so
  // it ends after the work has dropped its buffers.
  class WorkInFlight {
   public:
    explicit WorkInFlight(ObjectStores* stores) : stores_(stores) {
      stores_->work_in_flight_.fetch_add(1, std::memory_order_relaxed);
    }
    ~WorkInFlight() {
      stores_->work_in_flight_.fetch_sub(1, std::memory_order_seq_cst);
      stores_->NotifyMemoryWaiters();
    }
    WorkInFlight(const WorkInFlight&) = delete;
    WorkInFlight& operator=(const WorkInFlight&) = delete;

   private:
    ObjectStores* stores_;
  };
  int64_t work_in_flight() const { return work_in_flight_.load(std::memory_order_seq_cst); }
  // Wakes Reserve() waiters to look again: after memory was freed or work
  // ended, or when what they check for cancellation may have changed.
  void NotifyMemoryWaiters();
  // Threads waiting for memory in Reserve(), now.
  int memory_waiters() const { return waiters_.load(std::memory_order_relaxed); }

  // Lists a program's account for ProgramAccounts() (once: later calls
  // cost one atomic load) and keeps it alive while the program or any
  // buffer charged to it lives, so buffers refer to it by a plain pointer.
  void ListAccount(const std::shared_ptr<MemoryAccount>& account) {
    if (account->listed_by_.load(std::memory_order_acquire) != this) ListAccountSlow(account);
  }
  // The listed accounts (dropping those of programs that are gone and hold
  // no buffers).
  std::vector<std::shared_ptr<MemoryAccount>> ProgramAccounts();

  // Bytes of live sharded buffers, and their number.
  int64_t TotalLiveBytes() const { return live_bytes_.load(std::memory_order_relaxed); }
  int64_t live_buffers() const { return live_buffers_.load(std::memory_order_relaxed); }
  // Bytes charged to all devices, arena reservations included.
  int64_t TotalBytesCharged() const;
  // Bytes of live buffers' shards on `device` (O(device lists), for stats).
  int64_t LiveBytesOn(const Device* device);

 private:
  struct Arena;
  friend class MemoryReservation;
  void ListAccountSlow(const std::shared_ptr<MemoryAccount>& account);
  Arena* ArenaFor(const DeviceList* devices);
  // Charges or gives back arena memory, without counting buffers; a give
  // back wakes memory waiters unless `notify` is false.
  absl::Status Charge(const DeviceList* devices, int64_t bytes_per_device);
  void Discharge(const DeviceList* devices, int64_t bytes_per_device, bool notify = true);
  // All requests or none; ResourceExhausted from the first that fails.
  absl::Status TryReserve(absl::Span<const MemoryRequest> requests, MemoryReservation* out);
  // ResourceExhausted if the requests need more than a device's capacity.
  absl::Status CheckCanEverFit(absl::Span<const MemoryRequest> requests, absl::string_view what) const;
  void WakeMemoryWaiters();
  // Waits up to `timeout_ns` for a notification after `generation`.
  bool AwaitMemoryEvent(uint64_t generation, int64_t timeout_ns);

  const Cluster* cluster_;
  std::vector<std::unique_ptr<ObjectStore>> stores_;
  std::unique_ptr<std::atomic<Arena*>[]> arenas_;  // by DeviceList::id()
  Mutex arenas_mu_;                                // serializes arena creation
  std::vector<Arena*> all_arenas_ ABSL_GUARDED_BY(arenas_mu_);
  std::atomic<int64_t> live_bytes_{0};
  std::atomic<int64_t> live_buffers_{0};
  std::atomic<int64_t> work_in_flight_{0};
  std::atomic<int> waiters_{0};
  Mutex accounts_mu_;
  std::vector<std::shared_ptr<MemoryAccount>> accounts_ ABSL_GUARDED_BY(accounts_mu_);
  Mutex memory_mu_;
  CondVar memory_cv_;
  uint64_t memory_generation_ ABSL_GUARDED_BY(memory_mu_) = 0;
};

}  // namespace pw

#endif  // PATHWAYS_OBJECT_STORE_OBJECT_STORE_H_
