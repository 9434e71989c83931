#include "csrc/coordination/interconnect.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

// 2 islands x 2 hosts x 2 devices: devices 0,1 on host 0 and 2,3 on host 1
// (island 0); 4,5 on host 2 and 6,7 on host 3 (island 1).
class InterconnectModelTest : public ::testing::Test {
 protected:
  void Build(int64_t ici_latency_ns, int64_t ici_bps, int64_t dcn_latency_ns, int64_t dcn_bps) {
    TopologyOptions options;
    options.hosts_per_island = 2;
    options.devices_per_host = 2;
    options.ici_latency_ns = ici_latency_ns;
    options.ici_bandwidth_bps = ici_bps;
    options.dcn_latency_ns = dcn_latency_ns;
    options.dcn_bandwidth_bps = dcn_bps;
    // A new registry with the new cluster: an old one would hand back lists
    // of the freed devices for the new devices' addresses.
    model_.reset();
    registry_ = std::make_unique<DeviceListRegistry>();
    cluster_ = *Cluster::Create(options);
    model_ = InterconnectModel::Create(*cluster_);
    ASSERT_NE(model_, nullptr);
  }
  const DeviceList& List(std::vector<int> ids) {
    std::vector<Device*> devs;
    for (int id : ids) devs.push_back(cluster_->devices()[id]);
    return **registry_->Intern(devs);
  }
  InterconnectModel::Interval Move(std::vector<int> src, std::vector<int> dst, int64_t shard_bytes, int64_t now) {
    return model_->Reserve(List(std::move(src)), List(std::move(dst)), shard_bytes, now);
  }

  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<DeviceListRegistry> registry_;
  std::unique_ptr<InterconnectModel> model_;
};

constexpr int64_t kNow = 1'000'000'000;  // any point of the clock
constexpr int64_t kGbps = 1'000'000'000;

TEST_F(InterconnectModelTest, NoModelWhenEveryKeyIsZero) {
  auto cluster = *Cluster::Create(TopologyOptions{});
  EXPECT_EQ(InterconnectModel::Create(*cluster), nullptr);
  TopologyOptions dcn_only;
  dcn_only.dcn_latency_ns = 1;
  EXPECT_NE(InterconnectModel::Create(**Cluster::Create(dcn_only)), nullptr);
}

TEST_F(InterconnectModelTest, HoldIsLatencyPlusBytesOverBandwidth) {
  Build(/*ici*/ 1'000, 8 * kGbps, /*dcn*/ 20'000, 1 * kGbps);
  EXPECT_EQ(model_->IciHoldNs(1000), 1'000 + 1'000);        // 1000 B at 1 GB/s: 1 us
  EXPECT_EQ(model_->DcnHoldNs(1000), 20'000 + 8'000);       // 8000 bits at 1 Gbit/s: 8 us
  EXPECT_EQ(model_->DcnHoldNs(1), 20'000 + 8);
  EXPECT_EQ(model_->IciHoldNs(1), 1'000 + 1);                // rounded up, never 0
  // Unlimited bandwidth: latency only; no latency: bytes only.
  Build(0, 0, 5'000, 0);
  EXPECT_EQ(model_->DcnHoldNs(int64_t{1} << 40), 5'000);
  EXPECT_EQ(model_->IciHoldNs(int64_t{1} << 40), 0);
  Build(0, 0, 0, 1'000'000);  // the slowest allowed link, 1 Mbit/s
  // 1 TiB at 1 Mbit/s: about 100 days, and no overflow.
  EXPECT_EQ(model_->DcnHoldNs(int64_t{1} << 40), (int64_t{1} << 40) * 8 * 1000);
}

TEST_F(InterconnectModelTest, DcnTransferHoldsBothNicsForLatencyPlusBytes) {
  Build(0, 0, 20'000, 1 * kGbps);
  // Devices 0,1 (host 0) to 4,5 (host 2): one flow of 2 shards.
  const auto t = Move({0, 1}, {4, 5}, 500, kNow);
  EXPECT_EQ(t.start_ns, kNow);
  EXPECT_EQ(t.end_ns, kNow + model_->DcnHoldNs(1000));
  EXPECT_GE(t.end_ns - t.start_ns, 20'000 + 1000 * 8);  // >= latency + bytes / bandwidth
}

TEST_F(InterconnectModelTest, TransfersFromOneHostSerializeOnItsNic) {
  Build(0, 0, 10'000, 1 * kGbps);
  const int64_t hold = model_->DcnHoldNs(2000);
  // Both leave host 0 at once (to hosts 2 and 3): the second waits for the first.
  const auto first = Move({0, 1}, {4, 5}, 1000, kNow);
  const auto second = Move({0, 1}, {6, 7}, 1000, kNow);
  EXPECT_EQ(first.end_ns, kNow + hold);
  EXPECT_EQ(second.start_ns, first.end_ns);
  EXPECT_EQ(second.end_ns, kNow + 2 * hold);  // twice as long, in aggregate
}

TEST_F(InterconnectModelTest, TransfersIntoOneHostSerializeOnItsNic) {
  Build(0, 0, 10'000, 1 * kGbps);
  const int64_t hold = model_->DcnHoldNs(2000);
  Move({0, 1}, {4, 5}, 1000, kNow);                     // host 0 -> host 2
  EXPECT_EQ(Move({2, 3}, {5, 4}, 1000, kNow).end_ns, kNow + 2 * hold);  // host 1 -> host 2
}

TEST_F(InterconnectModelTest, TransfersBetweenOtherHostsDoNotWait) {
  Build(0, 0, 10'000, 1 * kGbps);
  const int64_t hold = model_->DcnHoldNs(2000);
  EXPECT_EQ(Move({0, 1}, {4, 5}, 1000, kNow).end_ns, kNow + hold);  // host 0 -> host 2
  EXPECT_EQ(Move({2, 3}, {6, 7}, 1000, kNow).end_ns, kNow + hold);  // host 1 -> host 3
  // Opposite directions of the same NICs are separate links (full duplex).
  EXPECT_EQ(Move({4, 5}, {0, 1}, 1000, kNow).end_ns, kNow + hold);  // host 2 -> host 0
}

TEST_F(InterconnectModelTest, ALaterTransferFindsTheLinkFree) {
  Build(0, 0, 10'000, 1 * kGbps);
  const auto first = Move({0, 1}, {4, 5}, 1000, kNow);
  const int64_t later = first.end_ns + 5;
  EXPECT_EQ(Move({0, 1}, {4, 5}, 1000, later).start_ns, later);
}

TEST_F(InterconnectModelTest, ShardsOfOneHostPairGoAsOneFlow) {
  Build(0, 0, 10'000, 1 * kGbps);
  // Four shards from hosts 0 and 1 to hosts 2 and 3, interleaved: two
  // flows (0 -> 2 and 1 -> 3) of two shards each, each paying latency once.
  const auto t = Move({0, 2, 1, 3}, {4, 6, 5, 7}, 1000, kNow);
  EXPECT_EQ(t.end_ns, kNow + model_->DcnHoldNs(2000));
  // A list spanning islands: shard 0 crosses from island 0 to 1, shard 1 back.
  const auto back = Move({0, 4}, {6, 2}, 1000, t.end_ns);
  EXPECT_EQ(back.end_ns, t.end_ns + model_->DcnHoldNs(1000));
}

TEST_F(InterconnectModelTest, IciHoldsDevicePortsShardByShard) {
  Build(1'000, 8 * kGbps, 0, 0);
  const int64_t hold = model_->IciHoldNs(4000);
  // Shards 0->2 and 1->3 in parallel, each on its own ports.
  const auto t = Move({0, 1}, {2, 3}, 4000, kNow);
  EXPECT_EQ(t.start_ns, kNow);
  EXPECT_EQ(t.end_ns, kNow + hold);
  // The same ports again: queued behind; reversed direction: free.
  EXPECT_EQ(Move({0, 1}, {3, 2}, 4000, kNow).end_ns, kNow + 2 * hold);
  EXPECT_EQ(Move({2, 3}, {0, 1}, 4000, kNow).end_ns, kNow + hold);
  // Across hosts of one island is still ICI: device 4 -> 6 on island 1.
  EXPECT_EQ(Move({4, 5}, {6, 7}, 4000, kNow).end_ns, kNow + hold);
  // A shard that stays on its device crosses no link.
  EXPECT_EQ(Move({4, 7}, {4, 5}, 4000, kNow).end_ns, kNow + hold);  // only 7 -> 5 moves
}

TEST_F(InterconnectModelTest, EachKindOnlyOnItsOwnLinks) {
  Build(0, 0, 10'000, 1 * kGbps);  // DCN modeled, ICI free
  EXPECT_EQ(Move({0, 1}, {2, 3}, 1 << 20, kNow).end_ns, kNow);  // ICI: nothing to wait for
  EXPECT_EQ(Move({0, 1}, {4, 5}, 1000, kNow).end_ns, kNow + model_->DcnHoldNs(2000));
  Build(1'000, 0, 0, 0);  // ICI modeled, DCN free
  EXPECT_EQ(Move({0, 1}, {4, 5}, 1 << 20, kNow).end_ns, kNow);
  EXPECT_EQ(Move({0, 1}, {2, 3}, 1 << 20, kNow).end_ns, kNow + 1'000);
}

}  // namespace
}  // namespace pw
