#include "csrc/coordination/transfer.h"

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
  (new TransferTask(pending, dst, LinkKind::kDcn, &stats_))->Start(&ready);
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
  (new TransferTask(failed, dst2, LinkKind::kIci, &stats_))->Start(&ready);
  job = ready.Pop();
  ASSERT_NE(job, nullptr);
  job->Run(ctx);
  EXPECT_EQ(dst2->Await().message(), "producer failed");
}

}  // namespace
}  // namespace pw
