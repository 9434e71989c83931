#include "csrc/coordination/transfer.h"

#include <cstring>

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
                           LinkKind link, TransferStats* stats)
    : in_flight_(dst->stores()), src_(std::move(src)), dst_(std::move(dst)), link_(link), stats_(stats) {}

void TransferTask::Start(ReadyList* ready) {
  if (!src_->AddWaiter(this)) ready->Push(this);
}

void TransferTask::OnBufferDone(const absl::Status&, ReadyList* ready) { ready->Push(this); }

void TransferTask::Run(RunContext& ctx) {
  absl::Status status = src_->status();
  if (status.ok()) status = src_->devices()->CheckHealthy();
  if (status.ok()) status = dst_->devices()->CheckHealthy();
  if (status.ok()) {
    std::memcpy(dst_->data(), src_->data(), static_cast<size_t>(src_->total_bytes()));
    if (link_ == LinkKind::kDcn) {
      stats_->dcn_bytes.fetch_add(src_->total_bytes(), std::memory_order_relaxed);
      stats_->dcn_transfers.fetch_add(1, std::memory_order_relaxed);
    } else {
      stats_->ici_bytes.fetch_add(src_->total_bytes(), std::memory_order_relaxed);
      stats_->ici_transfers.fetch_add(1, std::memory_order_relaxed);
    }
    src_.reset();  // before the copy is seen ready, as a gang drops its inputs
    dst_->SetReady(ctx.ready);
  } else {
    src_.reset();
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
