#include "csrc/coordination/transfer.h"

#include <cstring>

#include "csrc/base/spin.h"

namespace pw {

absl::string_view LinkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kNone:
      return "none";
    case LinkKind::kIci:
      return "ici";
    case LinkKind::kDcn:
      return "dcn";
  }
  return "?";
}

LinkKind ClassifyLink(const DeviceList& src, const DeviceList& dst) {
  if (&src == &dst) return LinkKind::kNone;
  if (src.island() != nullptr && src.island() == dst.island()) return LinkKind::kIci;
  return LinkKind::kDcn;
}

TransferTask::TransferTask(std::shared_ptr<ShardedBuffer> src, std::shared_ptr<ShardedBuffer> dst,
                           LinkKind link, const TransferServices* services)
    : in_flight_(dst->stores()), src_(std::move(src)), dst_(std::move(dst)), link_(link), services_(services) {}

void TransferTask::Start(ReadyList* ready) {
  if (!src_->AddWaiter(this)) ready->Push(this);
}

void TransferTask::OnBufferDone(const absl::Status&, ReadyList* ready) { ready->Push(this); }

bool TransferTask::OnFailedDevice() const {
  return src_->devices()->FailedDevice() != nullptr || dst_->devices()->FailedDevice() != nullptr;
}

void TransferTask::Run(RunContext& ctx) {
  absl::Status status;
  if (copied_) {  // back from the delay queue: a device may have failed meanwhile
    status = src_->devices()->CheckHealthy();
    if (status.ok()) status = dst_->devices()->CheckHealthy();
    Finish(ctx, std::move(status));
    return;
  }
  status = src_->status();
  if (status.ok()) status = src_->devices()->CheckHealthy();
  if (status.ok()) status = dst_->devices()->CheckHealthy();
  if (!status.ok()) {
    Finish(ctx, std::move(status));
    return;
  }
  InterconnectModel* model = services_->interconnect;
  // The clock is read only when someone looks: no model and no recording
  // leaves the path as it was (a copy and two counters).
  Timeline* timeline = services_->timeline;
  if (model != nullptr || (timeline != nullptr && timeline->recording())) start_ns_ = NowNanos();
  const int64_t bytes = src_->total_bytes();
  std::memcpy(dst_->data(), src_->data(), static_cast<size_t>(bytes));
  TransferStats* stats = services_->stats;
  if (link_ == LinkKind::kDcn) {
    stats->dcn_bytes.fetch_add(bytes, std::memory_order_relaxed);
    stats->dcn_transfers.fetch_add(1, std::memory_order_relaxed);
  } else {
    stats->ici_bytes.fetch_add(bytes, std::memory_order_relaxed);
    stats->ici_transfers.fetch_add(1, std::memory_order_relaxed);
  }
  if (model != nullptr) {
    const int shards = src_->devices()->size();
    const InterconnectModel::Interval held =
        model->Reserve(*src_->devices(), *dst_->devices(), bytes / shards, start_ns_);
    start_ns_ = held.start_ns;
    if (held.end_ns > NowNanos()) {
      copied_ = true;
      services_->delays->RunAt(held.end_ns, this);  // runs Run() again then
      return;
    }
  }
  Finish(ctx, absl::OkStatus());
}

void TransferTask::Finish(RunContext& ctx, absl::Status status) {
  // Record before completing: once `dst` is ready a waiter may stop the
  // timeline, and must see this transfer. (Not one whose copy began before
  // the recording: its start was not read.)
  Timeline* timeline = services_->timeline;
  if (status.ok() && start_ns_ != 0 && timeline != nullptr && timeline->recording()) {
    TimelineEvent event;
    event.devices = dst_->devices();
    event.source = src_->devices();
    event.start_ns = start_ns_;
    event.end_ns = NowNanos();
    event.link = LinkKindName(link_);
    event.bytes = dst_->total_bytes();
    timeline->Record(std::move(event));
  }
  src_.reset();  // before the copy is seen ready, as a gang drops its inputs
  if (status.ok()) {
    dst_->SetReady(ctx.ready);
  } else {
    dst_->SetError(std::move(status), ctx.ready);
  }
  delete this;
}

absl::StatusOr<std::shared_ptr<ShardedBuffer>> CopyFromHost(ObjectStores* stores, DType dtype, Dims dims,
                                                            const void* data, const DeviceList* devices,
                                                            TransferStats* stats, const BufferOwner& owner) {
  auto buffer = ShardedBuffer::Allocate(stores, dtype, std::move(dims), devices, owner);
  if (!buffer.ok()) return buffer.status();
  if ((*buffer)->is_remote()) {
    if (absl::Status sent = owner.remote->Write(**buffer, data); !sent.ok()) return sent;
  } else {
    std::memcpy((*buffer)->data(), data, static_cast<size_t>((*buffer)->total_bytes()));
  }
  stats->host_bytes.fetch_add((*buffer)->total_bytes(), std::memory_order_relaxed);
  stats->host_transfers.fetch_add(1, std::memory_order_relaxed);
  ReadyList none;  // a fresh buffer has no waiters
  (*buffer)->SetReady(&none);
  return buffer;
}

}  // namespace pw
