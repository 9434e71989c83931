#include "csrc/object_store/sharded_buffer.h"

#include <thread>

#include "gtest/gtest.h"

namespace pw {
namespace {

class CountingWaiter : public BufferWaiter {
 public:
  void OnBufferDone(const absl::Status& status, ReadyList*) override {
    ++calls;
    last = status;
  }
  int calls = 0;
  absl::Status last;
};

class ShardedBufferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TopologyOptions options;
    options.device_memory_bytes = 1024;
    cluster_ = *Cluster::Create(options);
    stores_ = std::make_unique<ObjectStores>(cluster_.get());
    const auto& d = cluster_->devices();
    pair_ = *registry_.Intern({d[0], d[1]});
  }
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ObjectStores> stores_;
  const DeviceList* pair_ = nullptr;
};

TEST_F(ShardedBufferTest, ChargesDevicesAndReturnsMemoryWithLastReference) {
  Device* d0 = cluster_->devices()[0];
  {
    auto buffer = ShardedBuffer::Allocate(stores_.get(), DType::kF32, {2, 8}, pair_);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ((*buffer)->shard_bytes(), 32);
    EXPECT_EQ(stores_->For(d0).bytes_in_use(d0), 32);
    EXPECT_EQ(stores_->TotalLiveBytes(), 64);
    EXPECT_EQ(stores_->live_buffers(), 1);
    std::shared_ptr<ShardedBuffer> second_ref = *buffer;
    buffer->reset();
    EXPECT_EQ(stores_->TotalLiveBytes(), 64);  // still referenced
  }
  EXPECT_EQ(stores_->TotalLiveBytes(), 0);
  EXPECT_EQ(stores_->live_buffers(), 0);
  // The arena keeps at most a chunk (capacity / 256) per device in reserve.
  EXPECT_LE(stores_->For(d0).bytes_in_use(d0), 4);
}

TEST_F(ShardedBufferTest, OutOfMemoryIsAnErrorAndChargesNothing) {
  auto big = ShardedBuffer::Allocate(stores_.get(), DType::kF64, {2, 100}, pair_);
  ASSERT_TRUE(big.ok());
  auto too_big = ShardedBuffer::Allocate(stores_.get(), DType::kF64, {2, 100}, pair_);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("out of device memory on TpuDevice(id=0"),
            absl::string_view::npos)
      << too_big.status();
  EXPECT_EQ(stores_->TotalLiveBytes(), 1600);
  EXPECT_EQ(stores_->TotalBytesCharged(), 1600);
}

TEST_F(ShardedBufferTest, LeadingAxisMustMatchDevices) {
  auto bad = ShardedBuffer::Allocate(stores_.get(), DType::kF32, {3}, pair_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("leading axis of size 2"), absl::string_view::npos);
}

TEST_F(ShardedBufferTest, WaitersRunOnceOnCompletion) {
  auto buffer = *ShardedBuffer::Allocate(stores_.get(), DType::kF32, {2}, pair_);
  CountingWaiter w1, w2;
  EXPECT_TRUE(buffer->AddWaiter(&w1));
  EXPECT_TRUE(buffer->AddWaiter(&w2));
  EXPECT_FALSE(buffer->IsDone());
  ReadyList ready;
  buffer->SetError(absl::InternalError("boom"), &ready);
  EXPECT_EQ(w1.calls, 1);
  EXPECT_EQ(w2.calls, 1);
  EXPECT_EQ(w1.last.message(), "boom");
  CountingWaiter late;
  EXPECT_FALSE(buffer->AddWaiter(&late));
  EXPECT_EQ(late.calls, 0);
  EXPECT_EQ(buffer->Await().message(), "boom");
}

TEST_F(ShardedBufferTest, AwaitWakesAcrossThreads) {
  for (int delay_us : {0, 100, 5000}) {
    auto buffer = *ShardedBuffer::Allocate(stores_.get(), DType::kF32, {2}, pair_);
    std::thread producer([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      static_cast<float*>(buffer->data())[1] = 7.f;
      ReadyList ready;
      buffer->SetReady(&ready);
    });
    EXPECT_TRUE(buffer->Await().ok());
    EXPECT_EQ(static_cast<float*>(buffer->data())[1], 7.f);
    producer.join();
  }
}

}  // namespace
}  // namespace pw
