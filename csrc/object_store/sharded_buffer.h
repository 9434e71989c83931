#ifndef PATHWAYS_OBJECT_STORE_SHARDED_BUFFER_H_
#define PATHWAYS_OBJECT_STORE_SHARDED_BUFFER_H_

// A sharded buffer (paper §4.2, §4.6): one logical array spread over an
// ordered DeviceList, in pmap layout: the leading axis has one entry per
// device, and shard i (the array's [i] slice) lives on device i.
//
// It is also the future of the computation that produces it: it is created
// (and its memory charged to the devices' object stores) when the producer is
// dispatched, and becomes ready (or failed) when the producer finishes.
// Bookkeeping is per logical buffer, never per shard: one refcount (the
// shared_ptr), one readiness state, one waiter list, and one contiguous
// allocation holding all shards shard-major. Device memory is returned when
// the last reference goes.
//
// Thread-safe. Data may be read only after the buffer is ready, and written
// only by its producer before it is ready.

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "csrc/base/dtype.h"
#include "csrc/base/mutex.h"
#include "csrc/base/runnable.h"
#include "csrc/cluster/device_list.h"
#include "csrc/object_store/object_store.h"

namespace pw {

// Something that waits for a buffer: embedded in the consumer (no allocation
// to wait). Called once, on the thread that completes the buffer.
class BufferWaiter {
 public:
  // `status` is OK when the buffer is ready, or the producer's error.
  // Work that becomes ready goes into `ready`. Must not block.
  virtual void OnBufferDone(const absl::Status& status, ReadyList* ready) = 0;

 protected:
  ~BufferWaiter() = default;

 private:
  friend class ShardedBuffer;
  BufferWaiter* next_waiter_ = nullptr;
};

class ShardedBuffer;

// Where a buffer's shards live when hosts are processes (client/
// remote_cluster.h): in the host processes, not here. The client's
// ShardedBuffer of such a buffer has no bytes of its own (data() is null);
// it keeps the bookkeeping (memory charged, readiness) and its id on the
// hosts.
class RemoteShards {
 public:
  // A fresh buffer id.
  virtual uint64_t NewBufferId() = 0;
  // Sends `data` (every shard, shard-major) to the hosts of `buffer`.
  virtual absl::Status Write(const ShardedBuffer& buffer, const void* data) = 0;
  // Reads every shard of a ready `buffer` into `dst` (shard-major). Blocks.
  virtual absl::Status Read(const ShardedBuffer& buffer, void* dst) = 0;
  // `buffer` is gone: its hosts may free its shards. Must not block.
  virtual void Free(const ShardedBuffer& buffer) = 0;

 protected:
  ~RemoteShards() = default;
};

// Bytes of one shard of a buffer of `dtype` and global shape `dims` (dims[0]
// is the number of shards).
inline int64_t ShardBytes(DType dtype, const Dims& dims) {
  return dims.empty() ? 0 : NumElements(absl::MakeConstSpan(dims).subspan(1)) * DTypeSize(dtype);
}

// Where a new buffer's memory comes from and whom it is charged to.
struct BufferOwner {
  // Draw the memory from this reservation (see ObjectStores::Reserve); null,
  // or nothing left for the devices: charge the object stores now.
  MemoryReservation* reservation = nullptr;
  // The ownership labels (§4.6): the client and the program whose buffer
  // it is. Either may be null. Both must outlive the buffer (a program's
  // account does once ObjectStores::ListAccount has it).
  MemoryAccount* client = nullptr;
  MemoryAccount* program = nullptr;
  // The caller charged both accounts for this buffer already (a dispatch
  // charges a whole run at once).
  bool precharged = false;
  // Hosts as processes: the buffer's shards live there (no bytes here),
  // under `remote_id` (0: a fresh id from `remote`).
  RemoteShards* remote = nullptr;
  uint64_t remote_id = 0;
};

class ShardedBuffer {
 public:
  // Allocates a pending buffer of `dtype` and global shape `dims` over
  // `devices` (dims[0] must equal the number of devices: InvalidArgument
  // otherwise). ResourceExhausted if a device's memory is full; nothing stays
  // charged then. `stores` must outlive the buffer.
  static absl::StatusOr<std::shared_ptr<ShardedBuffer>> Allocate(ObjectStores* stores, DType dtype,
                                                                  Dims dims, const DeviceList* devices,
                                                                  const BufferOwner& owner = {});
  ~ShardedBuffer();
  ShardedBuffer(const ShardedBuffer&) = delete;
  ShardedBuffer& operator=(const ShardedBuffer&) = delete;

  DType dtype() const { return dtype_; }
  // Global shape; dims()[0] == num_shards().
  const Dims& dims() const { return dims_; }
  const DeviceList* devices() const { return devices_; }
  // Whether its shards can still be had: Unavailable naming a failed device
  // of it (DeviceList::CheckHealthy), or HostLost for a remote buffer made
  // on a host process that a new one has replaced since (Device::Revive).
  absl::Status CheckDevices() const;
  int num_shards() const { return devices_->size(); }
  int64_t shard_bytes() const { return shard_bytes_; }
  int64_t total_bytes() const { return shard_bytes_ * num_shards(); }
  // All shards, shard-major: shard i at data() + i * shard_bytes(). Null
  // once the buffer has failed: a failed buffer gives its memory back at
  // once (it can never be read), so a failed program frees what it owned.
  // Null too for a remote buffer (see RemoteShards): use ReadInto().
  void* data() const { return data_; }
  // Copies every shard, shard-major, to `dst` (total_bytes()); the buffer
  // must be ready. From the hosts for a remote buffer (blocks).
  absl::Status ReadInto(void* dst) const;
  bool is_remote() const { return remote_ != nullptr; }
  uint64_t remote_id() const { return remote_id_; }
  ObjectStores* stores() const { return stores_; }
  // The ownership labels; null for none.
  const MemoryAccount* client_account() const { return client_; }
  const MemoryAccount* program_account() const { return program_; }

  // True once ready or failed.
  bool IsDone() const { return state_.load(std::memory_order_acquire) != kPending; }
  // Blocks until done (spins briefly, then sleeps); returns the status.
  // Never called from an executor thread.
  absl::Status Await() const;
  // Like Await(), but gives up after `timeout_ns`: true if the buffer is
  // done. Lets a caller wait in slices and check for interrupts between them.
  bool AwaitFor(int64_t timeout_ns) const;
  // The producer's status; OK while pending.
  absl::Status status() const;

  // Completes the buffer (call exactly once): runs the waiters, which put
  // newly ready work into `ready`, and wakes blocked Await() callers.
  void SetReady(ReadyList* ready) { Complete(absl::OkStatus(), ready); }
  void SetError(absl::Status error, ReadyList* ready) { Complete(std::move(error), ready); }

  // Ordering, for the gang schedulers' admission (proportional share): a
  // consumer may be ordered on island I once each input is done or will be
  // produced by something already ordered on I. MarkSequenced records that
  // the producing gang got its place on `island`; SetCopiedFrom makes a
  // transfer's destination follow its source within one island.
  void MarkSequenced(int island) { sequenced_island_.store(island, std::memory_order_release); }
  void SetCopiedFrom(const std::shared_ptr<ShardedBuffer>& source) { copied_from_ = source; }
  bool IsSequencedOn(int island) const;
  // The buffer this one is a copy of (SetCopiedFrom), while it lives; else null.
  std::shared_ptr<ShardedBuffer> copied_from() const { return copied_from_.lock(); }

  // Registers `waiter` to be called when the buffer is done. Returns false,
  // without registering, if it is already done (the caller proceeds at once).
  bool AddWaiter(BufferWaiter* waiter);

 private:
  enum State : int { kPending = 0, kReady = 1, kFailed = 2 };
  ShardedBuffer() = default;
  void Complete(absl::Status status, ReadyList* ready);
  // Gives back the device memory and, in process, the host memory (once).
  void ReleaseMemory();

  ObjectStores* stores_ = nullptr;
  DType dtype_ = DType::kF32;
  Dims dims_;
  const DeviceList* devices_ = nullptr;
  int64_t shard_bytes_ = 0;
  void* data_ = nullptr;
  RemoteShards* remote_ = nullptr;
  uint64_t remote_id_ = 0;
  MemoryAccount* client_ = nullptr;
  MemoryAccount* program_ = nullptr;
  bool memory_released_ = false;  // by the producer on failure, or the destructor

  std::atomic<int> state_{kPending};
  std::atomic<int> sequenced_island_{-1};
  std::weak_ptr<ShardedBuffer> copied_from_;  // set before the buffer is shared
  mutable Mutex mu_;
  mutable CondVar done_cv_;
  // Protects: the waiter list (taken whole on completion), the error status,
  // and the count of threads sleeping in Await() (signal only if nonzero).
  BufferWaiter* waiters_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  mutable int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pw

#endif  // PATHWAYS_OBJECT_STORE_SHARDED_BUFFER_H_
