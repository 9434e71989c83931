#include "csrc/coordination/interconnect.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/inlined_vector.h"

namespace pw {
namespace {

// Far beyond any run, far below int64 overflow: free times saturate here.
constexpr int64_t kFarFutureNs = int64_t{1} << 61;

// A DCN flow: the shards one host sends another, as one message.
struct DcnFlow {
  int src_host = 0, dst_host = 0;
  int64_t bytes = 0;
};

// A flow that waits for `out` and `in` to be free (no earlier than `now_ns`),
// then holds both for `hold_ns`; widens [first, last] to cover it.
void Take(int64_t& out, int64_t& in, int64_t hold_ns, int64_t now_ns, int64_t& first, int64_t& last) {
  const int64_t start = std::max({now_ns, out, in});
  const int64_t end = std::min(kFarFutureNs, start + hold_ns);
  out = in = end;
  first = std::min(first, start);
  last = std::max(last, end);
}

}  // namespace

std::unique_ptr<InterconnectModel> InterconnectModel::Create(const Cluster& cluster) {
  if (!cluster.options().models_interconnect()) return nullptr;
  return std::unique_ptr<InterconnectModel>(new InterconnectModel(cluster));
}

InterconnectModel::InterconnectModel(const Cluster& cluster)
    : ici_latency_ns_(cluster.options().ici_latency_ns),
      ici_bandwidth_bps_(cluster.options().ici_bandwidth_bps),
      dcn_latency_ns_(cluster.options().dcn_latency_ns),
      dcn_bandwidth_bps_(cluster.options().dcn_bandwidth_bps),
      models_ici_(ici_latency_ns_ != 0 || ici_bandwidth_bps_ != 0),
      models_dcn_(dcn_latency_ns_ != 0 || dcn_bandwidth_bps_ != 0),
      device_out_free_(cluster.num_devices(), 0),
      device_in_free_(cluster.num_devices(), 0),
      host_out_free_(cluster.hosts().size(), 0),
      host_in_free_(cluster.hosts().size(), 0) {}

int64_t InterconnectModel::HoldNs(int64_t latency_ns, int64_t bandwidth_bps, int64_t bytes) {
  double ns = static_cast<double>(latency_ns);
  if (bandwidth_bps > 0) ns += std::ceil(static_cast<double>(bytes) * 8e9 / static_cast<double>(bandwidth_bps));
  return ns >= static_cast<double>(kFarFutureNs) ? kFarFutureNs : static_cast<int64_t>(ns);
}

InterconnectModel::Interval InterconnectModel::Reserve(const DeviceList& src, const DeviceList& dst,
                                                       int64_t shard_bytes, int64_t now_ns) {
  // The DCN flows first, outside the lock: shards grouped by host pair, in
  // a fixed order. Lists usually run host by host, so the previous flow is
  // the one to add to; the sort merges the rest.
  absl::InlinedVector<DcnFlow, 8> dcn;
  const int n = std::min(src.size(), dst.size());
  if (models_dcn_) {
    for (int i = 0; i < n; ++i) {
      const Device* a = src[i];
      const Device* b = dst[i];
      if (a->island() == b->island()) continue;
      const int h = a->host()->id(), g = b->host()->id();
      if (!dcn.empty() && dcn.back().src_host == h && dcn.back().dst_host == g) {
        dcn.back().bytes += shard_bytes;
      } else {
        dcn.push_back(DcnFlow{h, g, shard_bytes});
      }
    }
    std::sort(dcn.begin(), dcn.end(), [](const DcnFlow& x, const DcnFlow& y) {
      return std::pair(x.src_host, x.dst_host) < std::pair(y.src_host, y.dst_host);
    });
    size_t merged = 0;
    for (size_t i = 0; i < dcn.size(); ++i) {
      if (merged > 0 && dcn[merged - 1].src_host == dcn[i].src_host && dcn[merged - 1].dst_host == dcn[i].dst_host) {
        dcn[merged - 1].bytes += dcn[i].bytes;
      } else {
        dcn[merged++] = dcn[i];
      }
    }
    dcn.resize(merged);
  }
  const int64_t ici_hold = models_ici_ ? IciHoldNs(shard_bytes) : 0;
  int64_t first = kFarFutureNs, last = now_ns;
  MutexLock lock(&mu_);
  if (models_ici_) {
    for (int i = 0; i < n; ++i) {
      const Device* a = src[i];
      const Device* b = dst[i];
      if (a == b || a->island() != b->island()) continue;
      Take(device_out_free_[a->id()], device_in_free_[b->id()], ici_hold, now_ns, first, last);
    }
  }
  for (const DcnFlow& f : dcn) {
    Take(host_out_free_[f.src_host], host_in_free_[f.dst_host], DcnHoldNs(f.bytes), now_ns, first, last);
  }
  return Interval{std::min(first, last), last};
}

}  // namespace pw
