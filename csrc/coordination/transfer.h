#ifndef PATHWAYS_COORDINATION_TRANSFER_H_
#define PATHWAYS_COORDINATION_TRANSFER_H_

// Data movement between the devices of different slices (paper §4.2–4.3):
// over ICI inside an island, over DCN across islands, and from host memory
// onto devices. A transfer is not gang-scheduled: it runs on the devices'
// DMA engines, not in their compute queues, as soon as its source is ready.
// Its destination buffer is allocated when the transfer is dispatched, so the
// consumer can be dispatched against it at once (the paper's "input buffer
// addresses transmitted to the producer's host").
//
// In this in-process cluster the bytes are copied with memcpy; the link
// kind is recorded (and counted) so that tests and traces can see which
// edges crossed islands.

#include <atomic>
#include <cstdint>
#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "csrc/base/runnable.h"
#include "csrc/cluster/device_list.h"
#include "csrc/object_store/sharded_buffer.h"

namespace pw {

enum class LinkKind : uint8_t {
  kNone,  // same devices: no transfer
  kIci,   // within one island
  kDcn,   // across islands
};

absl::string_view LinkKindName(LinkKind kind);  // "none", "ici", "dcn"

// The link data takes from `src` to `dst` (shard i to shard i).
LinkKind ClassifyLink(const DeviceList& src, const DeviceList& dst);

// Bytes moved per link kind, process-wide. Thread-safe.
struct TransferStats {
  std::atomic<int64_t> ici_bytes{0}, dcn_bytes{0}, host_bytes{0};
  std::atomic<int64_t> ici_transfers{0}, dcn_transfers{0}, host_transfers{0};
};

// Copies `src` shard by shard into `dst` (same dtype, dims and shard count,
// other devices) once `src` is ready; `dst` becomes ready (or inherits the
// error) afterwards. Owns itself: deletes itself after it runs.
class TransferTask final : public Runnable, private BufferWaiter {
 public:
  TransferTask(std::shared_ptr<ShardedBuffer> src, std::shared_ptr<ShardedBuffer> dst, LinkKind link,
               TransferStats* stats);

  // Makes the transfer wait for its source; puts it into `ready` if the
  // source is already done. Call once, after construction.
  void Start(ReadyList* ready);

  void Run(RunContext& ctx) override;

 private:
  void OnBufferDone(const absl::Status& status, ReadyList* ready) override;

  ObjectStores::WorkInFlight in_flight_;  // first: ends after the buffers go
  std::shared_ptr<ShardedBuffer> src_, dst_;
  LinkKind link_;
  TransferStats* stats_;
};

// Allocates a buffer on `devices` and fills it from host memory `data`
// (row-major, the buffer's dtype and global dims). The copy is done before
// returning, so the caller may reuse `data`; the buffer is ready. `owner`
// as in ShardedBuffer::Allocate.
absl::StatusOr<std::shared_ptr<ShardedBuffer>> CopyFromHost(ObjectStores* stores, DType dtype, Dims dims,
                                                            const void* data, const DeviceList* devices,
                                                            TransferStats* stats, const BufferOwner& owner = {});

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_TRANSFER_H_
