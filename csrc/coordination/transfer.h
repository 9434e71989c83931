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
// edges crossed islands. With an interconnect model (interconnect.h) the
// destination becomes ready only once the modeled transfer ends.

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "csrc/base/runnable.h"
#include "csrc/cluster/device_list.h"
#include "csrc/coordination/interconnect.h"
#include "csrc/executor/delay_queue.h"
#include "csrc/executor/timeline.h"
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

// What transfers use while they run. Must outlive every transfer.
struct TransferServices {
  TransferStats* stats = nullptr;  // required
  // Where finished transfers are recorded while it records; null: nowhere.
  Timeline* timeline = nullptr;
  // The interconnect model; null (no model): a transfer is done once copied.
  InterconnectModel* interconnect = nullptr;
  // Runs a modeled transfer's end; required with `interconnect`.
  DelayQueue* delays = nullptr;
};

// Copies `src` shard by shard into `dst` (same dtype, dims and shard count,
// other devices) once `src` is ready; `dst` becomes ready (or inherits the
// error) afterwards: at once, or with an interconnect model when the
// modeled transfer ends (the copy is made at once; `src` is held until the
// end, as the link reads it until then). Owns itself: deletes itself once
// done.
class TransferTask final : public Runnable, private BufferWaiter {
 public:
  TransferTask(std::shared_ptr<ShardedBuffer> src, std::shared_ptr<ShardedBuffer> dst, LinkKind link,
               const TransferServices* services);

  // Makes the transfer wait for its source; puts it into `ready` if the
  // source is already done. Call once, after construction.
  void Start(ReadyList* ready);

  // First run: checks, copies, and completes `dst` or, with a model, waits
  // in the delay queue for the modeled end. Second run (from there):
  // completes `dst`, failed if a device of either side failed meanwhile.
  void Run(RunContext& ctx) override;

  // True if a device of its source or destination has failed: the runtime
  // then ends a modeled transfer early, failed (DelayQueue's hurry rule).
  bool OnFailedDevice() const;

 private:
  void OnBufferDone(const absl::Status& status, ReadyList* ready) override;
  // Records the transfer (if the timeline records), then completes `dst`
  // with `status` and deletes this.
  void Finish(RunContext& ctx, absl::Status status);

  ObjectStores::WorkInFlight in_flight_;  // first: ends after the buffers go
  std::shared_ptr<ShardedBuffer> src_, dst_;
  LinkKind link_;
  bool copied_ = false;  // Run() is called again at the modeled end
  const TransferServices* services_;
  int64_t start_ns_ = 0;  // when the links were taken (or the copy began)
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
