#ifndef PATHWAYS_HOST_HOST_BUFFERS_H_
#define PATHWAYS_HOST_HOST_BUFFERS_H_

// A host's shards of the client's buffers (HostBuffer), and the store of
// them by id (HostBuffers): what a client's PutBuffer, FetchBuffer and
// FreeBuffers reach, and where a run's steps find their inputs and make
// their outputs (host_executor.h).
//
// Ids are a client session's: the store keys its buffers and puts by
// session and id (SessionKey, host_runs.h), so two sessions' buffers of the
// same id are two buffers, and a session never sees another's.
//
// Thread-safe. Lock order: the executor's tables' lock (a run's lookups),
// then the store's, then a buffer's own. Completing a buffer runs its
// waiters on the completing thread, possibly under the store's lock (a Put
// that fails its buffer, a Free of a buffer still being put).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "csrc/base/mutex.h"
#include "csrc/coordination/control.pb.h"
#include "csrc/host/host_runs.h"

namespace pw {

// Bounds what a client may ask of one host: a shard's bytes, at most a
// device's memory, so products with shard counts fit.
inline constexpr int64_t kMaxShardBytes = int64_t{1} << 40;
inline bool ShardBytesOk(int64_t bytes) { return bytes >= 0 && bytes <= kMaxShardBytes; }

// This host's shards of one sharded buffer, contiguous in list order; also
// the future of whatever produces them here.
class HostBuffer {
 public:
  HostBuffer(uint64_t id, int64_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint64_t id() const { return id_; }
  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  // False if its memory could not be allocated (then it is never written),
  // and once it has failed (its memory is given back then).
  bool allocated() const { return data_ != nullptr; }
  absl::Status AllocationError() const;

  // Calls `fn` with the status once the buffer is done: at once, on this
  // thread, if it is done already. `fn` must not block.
  void OnDone(absl::AnyInvocable<void(const absl::Status&) &&> fn);
  bool done() const;
  // Done with an error.
  bool failed() const;
  // Waits until done or `stopping` is set; the status (Cancelled if stopped).
  absl::Status Await(const std::atomic<bool>& stopping);
  // Completes the buffer (once).
  void Complete(const absl::Status& status);

 private:
  const uint64_t id_;
  const int64_t bytes_;
  uint8_t* data_ = nullptr;
  mutable Mutex mu_;
  CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::AnyInvocable<void(const absl::Status&) &&>> waiters_ ABSL_GUARDED_BY(mu_);
};

// The buffers this host holds, by session and id, and the puts in progress.
class HostBuffers {
 public:
  // `host_id` names this host in errors. `first_buffer_id`: for a process
  // that replaces a lost host (JoinCluster's), kOneSession's buffer ids
  // below it were the earlier process's: one of them that is missing here
  // was lost with that process (HostLost), not never made.
  explicit HostBuffers(int host_id, uint64_t first_buffer_id = 0)
      : host_id_(host_id), first_buffer_id_(first_buffer_id) {}
  HostBuffers(const HostBuffers&) = delete;
  HostBuffers& operator=(const HostBuffers&) = delete;

  // One chunk of a buffer of `session`; `local_shards`: how many shards of
  // the chunk's device list this host holds, or why that list is not here.
  // An error also fails the buffer here (made, failed, if this was its
  // first chunk), so its readers and runs get it; its later chunks are
  // dropped.
  absl::Status Put(SessionId session, wire::PutBuffer& request, const absl::StatusOr<int64_t>& local_shards);
  // Gets a range of this host's shards of a buffer of `session` once it is
  // done.
  void Fetch(SessionId session, const wire::FetchBuffer& request,
             absl::AnyInvocable<void(absl::StatusOr<std::string>) &&> done);
  // This host's shards of a buffer of `session` once it is done, held, not
  // copied: a done buffer's memory does not change until its last reference
  // goes (a put or run making the same id makes a new HostBuffer).
  void Hold(SessionId session, uint64_t buffer_id,
            absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<const HostBuffer>>) &&> done);
  void Free(SessionId session, const wire::FreeBuffers& request);
  // Forgets every buffer of `session` (a session that ended: HostExecutor::
  // EndSession); one still being put fails with `why` (nobody may wait for
  // the rest of it). Runs, transfers and fetches that hold one keep it
  // until they are done; the others are freed now.
  void EndSession(SessionId session, const absl::Status& why);
  // Buffers held now.
  int size() const;

  // A run's buffers are found, made and dropped under one lock: the caller
  // holds mu() around these.
  Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  // A new buffer `key` (replacing any buffer of that session and id).
  std::shared_ptr<HostBuffer> NewLocked(const SessionKey& key, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Buffer `key`; if it is not here, a stand-in failed with NotFound (the
  // client holds every buffer it names: one missing here is an error the
  // run reports, not a crash), or HostLost for the replaced process's,
  // which the store does not keep.
  std::shared_ptr<HostBuffer> LookupLocked(const SessionKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets buffer `key`, moving it to `dropped` (to free unlocked).
  void DropLocked(const SessionKey& key, std::vector<std::shared_ptr<HostBuffer>>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  // Put's checks and copy; the caller fails the buffer on an error.
  absl::Status PutLocked(SessionId session, wire::PutBuffer& request, const absl::StatusOr<int64_t>& local_shards)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Buffer `key`, or null if it is not here.
  std::shared_ptr<HostBuffer> Find(const SessionKey& key) const;
  // NotFound for buffer `key`, which is not here; HostLost for one of the
  // replaced process's (see first_buffer_id).
  absl::Status Missing(const SessionKey& key) const;

  const int host_id_;
  const uint64_t first_buffer_id_;
  mutable Mutex mu_;
  absl::flat_hash_map<SessionKey, std::shared_ptr<HostBuffer>> buffers_ ABSL_GUARDED_BY(mu_);
  // Buffers being put in chunks: where the next chunk goes.
  absl::flat_hash_map<SessionKey, int64_t> puts_in_progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_BUFFERS_H_
