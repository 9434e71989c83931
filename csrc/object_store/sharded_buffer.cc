#include "csrc/object_store/sharded_buffer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/fork.h"
#include "csrc/base/spin.h"
#include "csrc/object_store/host_memory_pool.h"

namespace pw {
namespace {
// How long Await() spins before it sleeps: a sleeping waiter costs the
// completing thread a futex wake (~25 us on our VMs).
constexpr int64_t kAwaitSpinNs = 50'000;
}  // namespace

absl::StatusOr<std::shared_ptr<ShardedBuffer>> ShardedBuffer::Allocate(ObjectStores* stores, DType dtype,
                                                                       Dims dims, const DeviceList* devices,
                                                                       const BufferOwner& owner) {
  if (dims.empty() || dims[0] != devices->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a sharded buffer over ", devices->size(), " devices needs a leading axis of size ", devices->size(),
        ", got shape ", DimsToString(dims)));
  }
  const int64_t shard_bytes = ShardBytes(dtype, dims);
  if (owner.reservation != nullptr && owner.reservation->Take(devices, shard_bytes)) {
    stores->CountAllocated(devices, shard_bytes);
  } else {
    // O(1) for a list whose arena has room; see ObjectStores.
    absl::Status charged = stores->Allocate(devices, shard_bytes);
    if (!charged.ok()) return charged;
  }
  auto buffer = std::shared_ptr<ShardedBuffer>(new ShardedBuffer());
  const int64_t total_bytes = shard_bytes * devices->size();
  if (!owner.precharged) {
    if (owner.client != nullptr) owner.client->Charge(total_bytes);
    if (owner.program != nullptr) owner.program->Charge(total_bytes);
  }
  buffer->client_ = owner.client;
  buffer->program_ = owner.program;
  buffer->stores_ = stores;
  buffer->dtype_ = dtype;
  buffer->dims_ = std::move(dims);
  buffer->devices_ = devices;
  buffer->shard_bytes_ = shard_bytes;
  if (owner.remote != nullptr) {
    buffer->remote_ = owner.remote;
    buffer->remote_id_ = owner.remote_id != 0 ? owner.remote_id : owner.remote->NewBufferId();
    return buffer;
  }
  const size_t total = static_cast<size_t>(std::max<int64_t>(shard_bytes * devices->size(), 1));
  buffer->data_ = HostMemoryPool::Get().Allocate(total);
  return buffer;
}

ShardedBuffer::~ShardedBuffer() {
  // In a forked child the stores' locks may be held by threads that did not
  // survive the fork; the memory goes with the child's exit.
  if (InForkedChild()) return;
  ReleaseMemory();
  // The hosts keep a remote buffer, failed or not, until the client drops
  // it: a failed one as its error, so a program that takes it later fails
  // with that error (the hosts free a failed buffer's bytes themselves).
  if (remote_ != nullptr) remote_->Free(*this);
}

void ShardedBuffer::ReleaseMemory() {
  if (memory_released_) return;
  memory_released_ = true;
  const int64_t total = shard_bytes_ * devices_->size();
  if (client_ != nullptr) client_->Discharge(total);
  if (program_ != nullptr) program_->Discharge(total);
  if (remote_ == nullptr) HostMemoryPool::Get().Free(data_, static_cast<size_t>(std::max<int64_t>(total, 1)));
  data_ = nullptr;
  stores_->Free(devices_, shard_bytes_);  // last: wakes memory waiters
}

absl::Status ShardedBuffer::CheckDevices() const {
  if (absl::Status healthy = devices_->CheckHealthy(); !healthy.ok()) return healthy;
  if (remote_ == nullptr || !Device::AnyRevived()) return absl::OkStatus();
  for (const Device* d : devices_->devices()) {
    if (remote_id_ < d->first_buffer_id()) {
      return HostLostError(absl::StrCat("buffer ", remote_id_, " was on device ", d->id(), " of host ",
                                        d->host()->id(), "'s earlier process, which was lost (a new one replaced it)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedBuffer::ReadInto(void* dst) const {
  if (remote_ != nullptr) return remote_->Read(*this, dst);
  if (data_ == nullptr) return absl::FailedPreconditionError("the buffer has no data (it failed)");
  std::memcpy(dst, data_, static_cast<size_t>(total_bytes()));
  return absl::OkStatus();
}

absl::Status ShardedBuffer::Await() const {
  SpinUntil([this] { return IsDone(); }, kAwaitSpinNs);
  MutexLock lock(&mu_);
  ++sleepers_;
  while (!IsDone()) done_cv_.Wait(&mu_);
  --sleepers_;
  return status_;
}

bool ShardedBuffer::AwaitFor(int64_t timeout_ns) const {
  if (SpinUntil([this] { return IsDone(); }, std::min(kAwaitSpinNs, timeout_ns))) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  MutexLock lock(&mu_);
  ++sleepers_;
  while (!IsDone() && done_cv_.WaitUntil(&mu_, deadline)) {
  }
  --sleepers_;
  return IsDone();
}

absl::Status ShardedBuffer::status() const {
  MutexLock lock(&mu_);
  return status_;
}

bool ShardedBuffer::IsSequencedOn(int island) const {
  if (IsDone() || sequenced_island_.load(std::memory_order_acquire) == island) return true;
  // A transfer within the island completes after its source without any
  // scheduling of its own; across islands only a finished copy counts.
  std::shared_ptr<ShardedBuffer> source = copied_from_.lock();
  return source != nullptr && source->devices()->island() != nullptr &&
         source->devices()->island()->id() == island && source->IsSequencedOn(island);
}

bool ShardedBuffer::AddWaiter(BufferWaiter* waiter) {
  MutexLock lock(&mu_);
  if (IsDone()) return false;
  waiter->next_waiter_ = waiters_;
  waiters_ = waiter;
  return true;
}

void ShardedBuffer::Complete(absl::Status status, ReadyList* ready) {
  // A failed buffer is never read: its memory goes back now, not when the
  // last reference goes. Only the producer, which is done writing, gets here.
  if (!status.ok()) ReleaseMemory();
  BufferWaiter* waiters;
  {
    MutexLock lock(&mu_);
    status_ = status;
    state_.store(status.ok() ? kReady : kFailed, std::memory_order_release);
    waiters = waiters_;
    waiters_ = nullptr;
    if (sleepers_ > 0) done_cv_.SignalAll();
  }
  // Outside the lock: a waiter may drop the last reference to a buffer.
  while (waiters) {
    BufferWaiter* next = waiters->next_waiter_;
    waiters->OnBufferDone(status, ready);
    waiters = next;
  }
}

}  // namespace pw
