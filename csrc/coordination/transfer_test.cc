#include "csrc/coordination/transfer.h"

#include "csrc/base/spin.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

class TransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = *Cluster::Create(TopologyOptions{});  // 2 islands x 8 devices
    stores_ = std::make_unique<ObjectStores>(cluster_.get());
  }
  const DeviceList* List(std::vector<int> ids) {
    std::vector<Device*> devs;
    for (int id : ids) devs.push_back(cluster_->devices()[id]);
    return *registry_.Intern(devs);
  }
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ObjectStores> stores_;
  TransferStats stats_;
  TransferServices services_{&stats_};
};

TEST_F(TransferTest, ClassifiesLinks) {
  EXPECT_EQ(ClassifyLink(*List({0, 1}), *List({0, 1})), LinkKind::kNone);
  EXPECT_EQ(ClassifyLink(*List({0, 1}), *List({2, 3})), LinkKind::kIci);
  EXPECT_EQ(ClassifyLink(*List({0, 1}), *List({8, 9})), LinkKind::kDcn);
}

TEST_F(TransferTest, CopiesWhenSourceBecomesReadyAndPropagatesErrors) {
  const double host[] = {1.5, -2.5};
  auto src = *CopyFromHost(stores_.get(), DType::kF64, {2}, host, List({0, 1}), &stats_);
  EXPECT_TRUE(src->IsDone());
  EXPECT_EQ(stats_.host_bytes.load(), 16);

  // Source pending: the transfer waits for it.
  auto pending = *ShardedBuffer::Allocate(stores_.get(), DType::kF64, {2}, List({0, 1}));
  auto dst = *ShardedBuffer::Allocate(stores_.get(), DType::kF64, {2}, List({8, 9}));
  ReadyList ready;
  (new TransferTask(pending, dst, LinkKind::kDcn, &services_))->Start(&ready);
  EXPECT_TRUE(ready.empty());
  std::memcpy(pending->data(), host, sizeof(host));
  pending->SetReady(&ready);
  std::vector<uint8_t> scratch;
  RunContext ctx{&ready, &scratch};
  Runnable* job = ready.Pop();
  ASSERT_NE(job, nullptr);
  job->Run(ctx);
  ASSERT_TRUE(dst->IsDone());
  EXPECT_EQ(static_cast<double*>(dst->data())[1], -2.5);
  EXPECT_EQ(stats_.dcn_bytes.load(), 16);

  // Failed source: the destination fails with the same error.
  auto failed = *ShardedBuffer::Allocate(stores_.get(), DType::kF64, {2}, List({0, 1}));
  auto dst2 = *ShardedBuffer::Allocate(stores_.get(), DType::kF64, {2}, List({2, 3}));
  failed->SetError(absl::InternalError("producer failed"), &ready);
  (new TransferTask(failed, dst2, LinkKind::kIci, &services_))->Start(&ready);
  job = ready.Pop();
  ASSERT_NE(job, nullptr);
  job->Run(ctx);
  EXPECT_EQ(dst2->Await().message(), "producer failed");
}

// With an interconnect model: the bytes are copied at once, but the
// destination is ready only at the modeled end, and the transfer shows on
// the timeline as an interval that long. Bounds are lower bounds only: the
// model enforces them, a loaded machine can only add to them.
class ModeledTransferTest : public ::testing::Test {
 protected:
  static constexpr int64_t kDcnLatencyNs = 2'000'000;     // 2 ms
  static constexpr int64_t kDcnBandwidthBps = 80'000'000;  // 10 MB/s: 1 ms per 10 kB
  void SetUp() override {
    TopologyOptions options;  // 2 islands x 2 hosts x 4 devices
    options.dcn_latency_ns = kDcnLatencyNs;
    options.dcn_bandwidth_bps = kDcnBandwidthBps;
    cluster_ = *Cluster::Create(options);
    stores_ = std::make_unique<ObjectStores>(cluster_.get());
    model_ = InterconnectModel::Create(*cluster_);
    delays_.SetHurryRule([](Runnable* job) {  // as the runtime's
      auto* transfer = dynamic_cast<TransferTask*>(job);
      return transfer != nullptr && transfer->OnFailedDevice();
    });
    services_ = TransferServices{&stats_, &timeline_, model_.get(), &delays_};
  }
  const DeviceList* List(std::vector<int> ids) {
    std::vector<Device*> devs;
    for (int id : ids) devs.push_back(cluster_->devices()[id]);
    return *registry_.Intern(devs);
  }
  // A ready buffer of `n` doubles per shard on `ids`, shard i filled with i + 0.5.
  std::shared_ptr<ShardedBuffer> Source(std::vector<int> ids, int64_t n) {
    const int64_t shards = static_cast<int64_t>(ids.size());
    std::vector<double> host(static_cast<size_t>(shards * n));
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<double>(i / n) + 0.5;
    return *CopyFromHost(stores_.get(), DType::kF64, {shards, n}, host.data(), List(std::move(ids)), &stats_);
  }
  // Starts a transfer of `src` to `dst_ids` and runs its first step here.
  std::shared_ptr<ShardedBuffer> Transfer(const std::shared_ptr<ShardedBuffer>& src, std::vector<int> dst_ids) {
    auto dst = *ShardedBuffer::Allocate(stores_.get(), src->dtype(), src->dims(), List(std::move(dst_ids)));
    ReadyList ready;
    (new TransferTask(src, dst, LinkKind::kDcn, &services_))->Start(&ready);
    std::vector<uint8_t> scratch;
    RunContext ctx{&ready, &scratch};
    while (Runnable* job = ready.Pop()) job->Run(ctx);
    return dst;
  }

  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ObjectStores> stores_;
  std::unique_ptr<InterconnectModel> model_;
  TransferStats stats_;
  Timeline timeline_;
  DelayQueue delays_;
  TransferServices services_;
};

TEST_F(ModeledTransferTest, DestinationIsReadyNoEarlierThanLatencyPlusBytesOverBandwidth) {
  auto src = Source({0, 1}, 625);  // 2 x 5000 bytes from host 0
  const int64_t bytes = src->total_bytes();
  const int64_t modeled = kDcnLatencyNs + bytes * 8 * 1'000'000'000 / kDcnBandwidthBps;  // 3 ms
  const int64_t session = timeline_.Start();
  const int64_t before = NowNanos();
  auto dst = Transfer(src, {8, 9});  // host 2, island 1
  ASSERT_TRUE(dst->Await().ok());
  EXPECT_GE(NowNanos() - before, modeled);
  EXPECT_EQ(static_cast<const double*>(dst->data())[625], 1.5);  // the bytes, exact
  EXPECT_EQ(stats_.dcn_bytes.load(), bytes);
  auto events = timeline_.Stop(session);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  const TimelineEvent& e = (*events)[0];
  EXPECT_EQ(e.source, src->devices());
  EXPECT_EQ(e.devices, dst->devices());
  EXPECT_EQ(e.link, "dcn");
  EXPECT_EQ(e.bytes, bytes);
  EXPECT_GE(e.start_ns, before);
  EXPECT_GE(e.end_ns - e.start_ns, modeled);
}

TEST_F(ModeledTransferTest, TwoTransfersFromOneHostTakeTurnsOnItsNic) {
  auto a = Source({0, 1}, 625);  // host 0
  auto b = Source({2, 3}, 625);  // host 0 too (devices 0-3)
  const int64_t one = kDcnLatencyNs + a->total_bytes() * 8 * 1'000'000'000 / kDcnBandwidthBps;
  const int64_t session = timeline_.Start();
  const int64_t before = NowNanos();
  auto to_a = Transfer(a, {8, 9});    // to host 2
  auto to_b = Transfer(b, {12, 13});  // to host 3: only the sending NIC is shared
  ASSERT_TRUE(to_a->Await().ok());
  ASSERT_TRUE(to_b->Await().ok());
  EXPECT_GE(NowNanos() - before, 2 * one);
  auto events = *timeline_.Stop(session);
  ASSERT_EQ(events.size(), 2u);
  const TimelineEvent& first = events[0].devices == to_a->devices() ? events[0] : events[1];
  const TimelineEvent& second = events[0].devices == to_a->devices() ? events[1] : events[0];
  EXPECT_GE(second.start_ns, first.start_ns + one);  // waited for the NIC
  EXPECT_GE(second.end_ns - before, 2 * one);
}

TEST_F(ModeledTransferTest, AFailedDeviceEndsTheModeledTimeWithItsError) {
  // 2 x 20 MB at 10 MB/s: 4 s modeled; the failure must not wait for them.
  auto src = Source({0, 1}, 2'500'000);
  const int64_t before = NowNanos();
  auto dst = Transfer(src, {8, 9});
  EXPECT_FALSE(dst->IsDone());
  ASSERT_TRUE(cluster_->devices()[9]->MarkFailed());
  delays_.ApplyHurryRule();
  const absl::Status status = dst->Await();
  EXPECT_LT(NowNanos() - before, int64_t{4'000'000'000});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("device 9"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace pw
