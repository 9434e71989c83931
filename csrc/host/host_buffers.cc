#include "csrc/host/host_buffers.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "csrc/object_store/host_memory_pool.h"

namespace pw {
namespace {

// What a buffer of `bytes` takes from the pool: at least 1 byte, whole
// 64-byte lines.
size_t PoolBytes(int64_t bytes) { return (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) / 64 * 64; }

}  // namespace

// ---- HostBuffer ----

// From the host memory pool, as in process: a step that frees and makes
// buffers of the same sizes (every training step, every transfer's
// destination) reuses their pages instead of faulting in fresh ones (about
// 1 us per 4 KiB: 16 ms for a 64 MiB destination).
HostBuffer::HostBuffer(uint64_t id, int64_t bytes) : id_(id), bytes_(bytes) {
  if (bytes < 0 || bytes > kMaxShardBytes * 65536) return;
  try {
    data_ = static_cast<uint8_t*>(HostMemoryPool::Get().Allocate(PoolBytes(bytes)));
  } catch (const std::bad_alloc&) {
    data_ = nullptr;
  }
}

absl::Status HostBuffer::AllocationError() const {
  return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes_, " bytes for buffer ", id_));
}

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) HostMemoryPool::Get().Free(data_, PoolBytes(bytes_));
}

void HostBuffer::OnDone(absl::AnyInvocable<void(const absl::Status&) &&> fn) {
  absl::Status status;
  {
    MutexLock lock(&mu_);
    if (!done_) {
      waiters_.push_back(std::move(fn));
      return;
    }
    status = status_;
  }
  std::move(fn)(status);
}

bool HostBuffer::done() const {
  MutexLock lock(&mu_);
  return done_;
}

bool HostBuffer::failed() const {
  MutexLock lock(&mu_);
  return done_ && !status_.ok();
}

absl::Status HostBuffer::Await(const std::atomic<bool>& stopping) {
  MutexLock lock(&mu_);
  while (!done_) {
    if (stopping.load(std::memory_order_acquire)) return absl::CancelledError("the host is stopping");
    cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  }
  return status_;
}

void HostBuffer::Complete(const absl::Status& status) {
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>> waiters;
  {
    MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    waiters.swap(waiters_);
    cv_.SignalAll();
    // A failed buffer is never read or written again (its producer is done,
    // readers look at the status first): its bytes go back now, while the
    // buffer stays, as its error, until the client frees it.
    if (!status.ok() && data_ != nullptr) {
      HostMemoryPool::Get().Free(data_, PoolBytes(bytes_));
      data_ = nullptr;
    }
  }
  for (auto& w : waiters) std::move(w)(status);
}

// ---- HostBuffers ----

std::shared_ptr<HostBuffer> HostBuffers::NewLocked(const SessionKey& key, int64_t bytes) {
  auto buffer = std::make_shared<HostBuffer>(key.id, bytes);
  buffers_[key] = buffer;
  return buffer;
}

std::shared_ptr<HostBuffer> HostBuffers::LookupLocked(const SessionKey& key) const {
  auto it = buffers_.find(key);
  if (it != buffers_.end()) return it->second;
  auto missing = std::make_shared<HostBuffer>(key.id, 0);
  missing->Complete(Missing(key));
  return missing;
}

std::shared_ptr<HostBuffer> HostBuffers::Find(const SessionKey& key) const {
  MutexLock lock(&mu_);
  auto it = buffers_.find(key);
  return it != buffers_.end() ? it->second : nullptr;
}

absl::Status HostBuffers::Missing(const SessionKey& key) const {
  if (key.session == kOneSession && key.id < first_buffer_id_) {
    return HostLostError(absl::StrCat("buffer ", key.id, " was lost with the earlier process of host ", host_id_,
                                      " (a new process replaced it)"));
  }
  return absl::NotFoundError(absl::StrCat("buffer ", key.id, " is not on host ", host_id_));
}

absl::Status HostBuffers::Put(SessionId session, wire::PutBuffer& request,
                              const absl::StatusOr<int64_t>& local_shards) {
  MutexLock lock(&mu_);
  absl::Status status = PutLocked(session, request, local_shards);
  if (status.ok()) return status;
  // Nobody hears a put's error (no reply): the buffer keeps it, so its
  // readers and the runs that use it get it, not "no such buffer" or a wait
  // for chunks that will not fit.
  const SessionKey key{session, request.buffer_id()};
  puts_in_progress_.erase(key);
  auto it = buffers_.find(key);
  // A stray later chunk of a buffer this host does not have (freed) makes
  // none: nobody would free it.
  if (it == buffers_.end() && request.offset() != 0) return status;
  std::shared_ptr<HostBuffer> buffer = it != buffers_.end() ? it->second : NewLocked(key, 0);
  buffer->Complete(absl::Status(status.code(), absl::StrCat(status.message(), " (on host ", host_id_, ")")));
  return status;
}

absl::Status HostBuffers::PutLocked(SessionId session, wire::PutBuffer& request,
                                    const absl::StatusOr<int64_t>& local_shards) {
  const uint64_t id = request.buffer_id();
  const SessionKey key{session, id};
  if (request.offset() != 0) {
    // A later chunk of a buffer that failed (a chunk refused, or no memory):
    // dropped, the buffer keeps its first error.
    auto it = buffers_.find(key);
    if (it != buffers_.end() && !puts_in_progress_.contains(key) && it->second->failed()) return absl::OkStatus();
  }
  if (!local_shards.ok()) {
    return absl::Status(local_shards.status().code(),
                        absl::StrCat("put: buffer ", id, ": ", local_shards.status().message()));
  }
  if (!ShardBytesOk(request.shard_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat("put: buffer ", id, ": bad shard_bytes ", request.shard_bytes()));
  }
  const int64_t want = *local_shards * request.shard_bytes();
  const int64_t offset = request.offset();
  const int64_t bytes = static_cast<int64_t>(request.data().size());
  if (offset < 0 || offset > want || bytes > want - offset) {
    return absl::InvalidArgumentError(absl::StrCat("put: buffer ", id, " has ", want, " bytes here; got ", bytes,
                                                   " at offset ", offset));
  }
  std::shared_ptr<HostBuffer> buffer;
  if (offset == 0) {
    buffer = NewLocked(key, want);
    puts_in_progress_.erase(key);
    if (!buffer->allocated()) {
      buffer->Complete(buffer->AllocationError());  // reading it says why; later chunks are dropped
      return absl::OkStatus();
    }
  } else {
    auto next = puts_in_progress_.find(key);
    auto it = buffers_.find(key);
    if (next == puts_in_progress_.end() || it == buffers_.end() || next->second != offset) {
      return absl::InvalidArgumentError(absl::StrCat("put: a chunk of buffer ", id, " at offset ", offset,
                                                     " that does not follow the one before"));
    }
    buffer = it->second;
  }
  if (bytes > 0) std::memcpy(buffer->data() + offset, request.data().data(), static_cast<size_t>(bytes));
  if (offset + bytes < want) {
    puts_in_progress_[key] = offset + bytes;
    return absl::OkStatus();
  }
  puts_in_progress_.erase(key);
  buffer->Complete(absl::OkStatus());
  return absl::OkStatus();
}

void HostBuffers::Free(SessionId session, const wire::FreeBuffers& request) {
  std::vector<std::shared_ptr<HostBuffer>> dropped;  // freed outside the lock
  MutexLock lock(&mu_);
  for (uint64_t id : request.buffer_ids()) DropLocked(SessionKey{session, id}, dropped);
}

void HostBuffers::EndSession(SessionId session, const absl::Status& why) {
  std::vector<std::shared_ptr<HostBuffer>> dropped;  // freed outside the lock
  MutexLock lock(&mu_);
  for (auto it = puts_in_progress_.begin(); it != puts_in_progress_.end();) {
    if (it->first.session != session) {
      ++it;
      continue;
    }
    if (auto buffer = buffers_.find(it->first); buffer != buffers_.end()) buffer->second->Complete(why);
    puts_in_progress_.erase(it++);
  }
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if (it->first.session != session) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second));
    buffers_.erase(it++);
  }
}

void HostBuffers::DropLocked(const SessionKey& key, std::vector<std::shared_ptr<HostBuffer>>& dropped) {
  auto it = buffers_.find(key);
  if (it == buffers_.end()) return;
  if (puts_in_progress_.erase(key) > 0) {  // nobody may wait for the rest of it
    it->second->Complete(absl::CancelledError(absl::StrCat("buffer ", key.id, " was freed before all of it came")));
  }
  dropped.push_back(std::move(it->second));
  buffers_.erase(it);
}

void HostBuffers::Fetch(SessionId session, const wire::FetchBuffer& request,
                        absl::AnyInvocable<void(absl::StatusOr<std::string>) &&> done) {
  const uint64_t buffer_id = request.buffer_id();
  std::shared_ptr<HostBuffer> buffer = Find(SessionKey{session, buffer_id});
  if (buffer == nullptr) {
    std::move(done)(Missing(SessionKey{session, buffer_id}));
    return;
  }
  const int64_t offset = request.offset();
  if (offset < 0 || offset > buffer->bytes() || request.max_bytes() < 0) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("fetch: buffer ", buffer_id, " has ", buffer->bytes(),
                                                            " bytes on host ", host_id_, "; asked for offset ",
                                                            offset, ", max_bytes ", request.max_bytes())));
    return;
  }
  int64_t bytes = buffer->bytes() - offset;
  if (request.max_bytes() > 0) bytes = std::min(bytes, request.max_bytes());
  buffer->OnDone([buffer, offset, bytes, done = std::move(done)](const absl::Status& status) mutable {
    if (!status.ok()) {
      std::move(done)(status);
      return;
    }
    std::move(done)(
        std::string(reinterpret_cast<const char*>(buffer->data()) + offset, static_cast<size_t>(bytes)));
  });
}

void HostBuffers::Hold(SessionId session, uint64_t buffer_id,
                       absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<const HostBuffer>>) &&> done) {
  std::shared_ptr<HostBuffer> buffer = Find(SessionKey{session, buffer_id});
  if (buffer == nullptr) {
    std::move(done)(Missing(SessionKey{session, buffer_id}));
    return;
  }
  buffer->OnDone([buffer, done = std::move(done)](const absl::Status& status) mutable {
    if (!status.ok()) {
      std::move(done)(status);
      return;
    }
    std::move(done)(std::shared_ptr<const HostBuffer>(std::move(buffer)));
  });
}

int HostBuffers::size() const {
  MutexLock lock(&mu_);
  return static_cast<int>(buffers_.size());
}

}  // namespace pw
