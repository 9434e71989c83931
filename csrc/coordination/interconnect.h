#ifndef PATHWAYS_COORDINATION_INTERCONNECT_H_
#define PATHWAYS_COORDINATION_INTERCONNECT_H_

// The interconnect model of the in-process cluster (TopologyOptions'
// ici_* and dcn_* keys): how long a transfer between slices (paper §4.3)
// holds the links it crosses, so that its destination is not ready before
// the bytes could have arrived, and transfers that share a link queue on it.
//
// The links:
//   * ICI, inside an island: every device has one ICI port each way. The
//     shard that moves from device a to device b holds a's outgoing port and
//     b's incoming one. A port stands for all of a chip's ICI links together:
//     the bandwidth to give is per device and direction.
//   * DCN, across islands: every host has one NIC each way, shared by the
//     transfers of all its devices. The shards that move from host h to host
//     g go as one message (a flow) that holds h's outgoing NIC and g's
//     incoming one; two transfers leaving the same host at once take turns
//     on its NIC, so each ends twice as late as alone, while transfers from
//     different hosts to different hosts do not wait for each other.
// A flow starts when both its ports are free (no earlier than the transfer
// starts), holds them for latency + bytes / bandwidth, and frees them then.
// A transfer is done when its last flow ends. Shards that stay on their
// device make no flow. Flows of one transfer take their ports in a fixed
// order (ICI shard by shard, then DCN by host pair), so the model is
// deterministic for a given order of transfers.
//
// This is a queueing model of link occupancy, not of packets: latency is
// paid per flow and holds the link (as a store-and-forward message would),
// routes inside an island are not modeled (every pair of devices is one
// hop), and the bytes themselves are still copied at once; only the moment
// the destination is ready moves. The copy is the floor: a transfer never
// completes before its real copy has.
//
// Thread-safe: one mutex, taken once per transfer, O(shards) under it. A
// runtime without the model has no InterconnectModel at all (Create returns
// null), so transfers then pay nothing for it.

#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/base/mutex.h"
#include "csrc/cluster/cluster.h"
#include "csrc/cluster/device_list.h"

namespace pw {

class InterconnectModel {
 public:
  // The model of `cluster`'s topology options; null if they model no
  // interconnect (TopologyOptions::models_interconnect() is false).
  // `cluster` must outlive the model.
  static std::unique_ptr<InterconnectModel> Create(const Cluster& cluster);

  // When a transfer holds links: from the first flow's start to the last
  // flow's end (NowNanos() clock). start_ns == end_ns == the given `now_ns`
  // if it crosses no modeled link.
  struct Interval {
    int64_t start_ns = 0;
    int64_t end_ns = 0;
  };

  // Reserves the links for moving shard i of `src` to shard i of `dst`
  // (`shard_bytes` each; the lists have the same size), starting no earlier
  // than `now_ns`, and returns when the transfer holds them. The caller
  // must complete the transfer no earlier than the returned end_ns.
  Interval Reserve(const DeviceList& src, const DeviceList& dst, int64_t shard_bytes, int64_t now_ns);

  // How long a flow of `bytes` holds an ICI or DCN link: latency + bytes /
  // bandwidth, in ns (rounded up; saturating far beyond any real run).
  int64_t IciHoldNs(int64_t bytes) const { return HoldNs(ici_latency_ns_, ici_bandwidth_bps_, bytes); }
  int64_t DcnHoldNs(int64_t bytes) const { return HoldNs(dcn_latency_ns_, dcn_bandwidth_bps_, bytes); }

 private:
  explicit InterconnectModel(const Cluster& cluster);
  static int64_t HoldNs(int64_t latency_ns, int64_t bandwidth_bps, int64_t bytes);

  const int64_t ici_latency_ns_, ici_bandwidth_bps_, dcn_latency_ns_, dcn_bandwidth_bps_;
  const bool models_ici_, models_dcn_;

  Mutex mu_;
  // When each port is next free (NowNanos() clock; 0: never taken). Indexed
  // by device id (ICI ports) and host id (DCN NICs), each way.
  std::vector<int64_t> device_out_free_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> device_in_free_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> host_out_free_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> host_in_free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_INTERCONNECT_H_
