// Back-pressure (ObjectStores::Reserve), work in flight, ownership accounts,
// and failed buffers giving their memory back.

#include "csrc/object_store/object_store.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "csrc/object_store/sharded_buffer.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

absl::Status NotCancelled() { return absl::OkStatus(); }

// Counts how often it is asked to block; gives up after `give_up_after`.
class CountingBlocker : public Blocker {
 public:
  explicit CountingBlocker(int give_up_after = 1 << 30) : give_up_after_(give_up_after) {}
  bool Block(absl::FunctionRef<bool(int64_t)> done_within) override {
    if (++blocks >= give_up_after_) return false;
    while (!done_within(1'000'000)) {
    }
    return true;
  }
  std::atomic<int> blocks{0};

 private:
  const int give_up_after_;
};

class ObjectStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TopologyOptions options;
    options.device_memory_bytes = 1024;
    cluster_ = *Cluster::Create(options);
    stores_ = std::make_unique<ObjectStores>(cluster_.get());
    const auto& d = cluster_->devices();
    pair_ = *registry_.Intern({d[0], d[1]});
    first_ = *registry_.Intern({d[0]});
  }
  std::shared_ptr<ShardedBuffer> Buffer(int64_t floats_per_shard, const BufferOwner& owner = {}) {
    auto b = ShardedBuffer::Allocate(stores_.get(), DType::kF32, {2, floats_per_shard}, pair_, owner);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *b : nullptr;
  }
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
  std::unique_ptr<ObjectStores> stores_;
  const DeviceList* pair_ = nullptr;
  const DeviceList* first_ = nullptr;
};

TEST_F(ObjectStoreTest, ReservationIsAllOrNothingAndReturnsWhatIsNotDrawn) {
  Device* d0 = cluster_->devices()[0];
  auto held = Buffer(128);  // 512 of 1024 bytes on each device
  // 400 on the pair fits, 400 more on device 0 alone does not: nothing stays.
  const MemoryRequest both[] = {{pair_, 400}, {first_, 400}};
  auto failed = stores_->Reserve(both, Blocker::Plain(), NotCancelled, "p");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(failed.status().message().find("held by live buffers"), std::string::npos) << failed.status();
  EXPECT_LE(stores_->For(d0).bytes_in_use(d0), 512 + 4);  // the arena keeps a 4-byte chunk
  {
    const MemoryRequest one[] = {{pair_, 400}};
    auto r = stores_->Reserve(one, Blocker::Plain(), NotCancelled, "p");
    ASSERT_TRUE(r.ok()) << r.status();
    const int64_t reserved = stores_->For(d0).bytes_in_use(d0);
    EXPECT_GE(reserved, 912);
    EXPECT_LE(reserved, 912 + 4);
    // A buffer drawn from it is not charged again.
    BufferOwner owner{&*r};
    auto drawn = ShardedBuffer::Allocate(stores_.get(), DType::kF32, {2, 25}, pair_, owner);  // 100 bytes
    ASSERT_TRUE(drawn.ok());
    EXPECT_EQ(stores_->For(d0).bytes_in_use(d0), reserved);
    EXPECT_EQ(stores_->live_buffers(), 2);
    drawn->reset();
    EXPECT_EQ(stores_->live_buffers(), 1);
  }  // the 300 bytes not drawn go back
  EXPECT_LE(stores_->For(d0).bytes_in_use(d0), 512 + 4);
}

TEST_F(ObjectStoreTest, MoreThanADeviceHoldsFailsWithoutWaiting) {
  const MemoryRequest requests[] = {{pair_, 600}, {first_, 600}};  // 1200 on device 0
  CountingBlocker blocker;
  ObjectStores::WorkInFlight busy(stores_.get());  // even with work in flight
  auto r = stores_->Reserve(requests, &blocker, NotCancelled, "prog");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(),
            "out of device memory on TpuDevice(id=0, island=0, host=0): 'prog' needs 1200 bytes there at once, "
            "more than the device's 1024 bytes");
  EXPECT_EQ(blocker.blocks.load(), 0);
}

TEST_F(ObjectStoreTest, WaitsWhileWorkInFlightCanFreeMemory) {
  auto held = Buffer(200);  // 800 bytes per device
  auto work = std::make_unique<ObjectStores::WorkInFlight>(stores_.get());
  std::atomic<bool> reserved{false};
  std::thread dispatcher([&] {
    const MemoryRequest r[] = {{pair_, 800}};
    auto res = stores_->Reserve(r, Blocker::Plain(), NotCancelled, "p");
    EXPECT_TRUE(res.ok()) << res.status();
    reserved = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(reserved.load());
  EXPECT_EQ(stores_->memory_waiters(), 1);
  // The work ends: first it drops its buffer, then it stops counting.
  held.reset();
  work.reset();
  dispatcher.join();
  EXPECT_TRUE(reserved.load());
  EXPECT_EQ(stores_->memory_waiters(), 0);
}

TEST_F(ObjectStoreTest, FailsOnceWorkEndsWithoutFreeingEnough) {
  auto held = Buffer(200);
  auto work = std::make_unique<ObjectStores::WorkInFlight>(stores_.get());
  absl::Status status;
  std::thread dispatcher([&] {
    const MemoryRequest r[] = {{pair_, 800}};
    status = stores_->Reserve(r, Blocker::Plain(), NotCancelled, "p").status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  work.reset();  // ends without freeing anything
  dispatcher.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
}

TEST_F(ObjectStoreTest, ABufferFreedByAnotherThreadEndsTheQuietWait) {
  // Nothing in flight: before failing, the reservation waits for memory to
  // stay quiet, so a buffer dropped by another thread meanwhile is seen.
  auto held = Buffer(200);
  std::thread dropper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held.reset();
  });
  const MemoryRequest r[] = {{pair_, 800}};
  auto res = stores_->Reserve(r, Blocker::Plain(), NotCancelled, "p");
  dropper.join();
  EXPECT_TRUE(res.ok()) << res.status();
}

TEST_F(ObjectStoreTest, CancellationAndInterruptionEndTheWait) {
  auto held = Buffer(200);
  ObjectStores::WorkInFlight busy(stores_.get());
  const MemoryRequest r[] = {{pair_, 800}};
  CountingBlocker gives_up(/*give_up_after=*/1);
  auto interrupted = stores_->Reserve(r, &gives_up, NotCancelled, "p");
  EXPECT_EQ(interrupted.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(interrupted.status().message().find("'p' was interrupted"), std::string::npos);

  std::atomic<bool> stop{false};
  absl::Status status;
  std::thread dispatcher([&] {
    status = stores_
                 ->Reserve(r, Blocker::Plain(),
                           [&] { return stop ? absl::CancelledError("shut down") : absl::OkStatus(); }, "p")
                 .status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop = true;
  stores_->NotifyMemoryWaiters();
  dispatcher.join();
  EXPECT_EQ(status, absl::CancelledError("shut down"));
}

TEST_F(ObjectStoreTest, AccountsCountTheirBuffers) {
  MemoryAccount client("c");
  auto program = std::make_shared<MemoryAccount>("p");
  stores_->ListAccount(program);
  {
    auto a = Buffer(10, BufferOwner{nullptr, &client, program.get()});
    auto b = Buffer(20, BufferOwner{nullptr, &client, nullptr});
    EXPECT_EQ(client.live_bytes(), 80 + 160);
    EXPECT_EQ(client.live_buffers(), 2);
    EXPECT_EQ(program->live_bytes(), 80);
    EXPECT_EQ(a->client_account(), &client);
    EXPECT_EQ(b->program_account(), nullptr);
  }
  EXPECT_EQ(client.live_bytes(), 0);
  EXPECT_EQ(client.live_buffers(), 0);
  EXPECT_EQ(client.peak_bytes(), 240);
  // Listed once, kept while its program lives, dropped after.
  stores_->ListAccount(program);
  ASSERT_EQ(stores_->ProgramAccounts().size(), 1u);
  auto buffer = Buffer(10, BufferOwner{nullptr, nullptr, program.get()});
  std::weak_ptr<MemoryAccount> weak = program;
  program.reset();
  EXPECT_EQ(stores_->ProgramAccounts().size(), 1u);  // a buffer still holds it
  buffer.reset();
  EXPECT_TRUE(stores_->ProgramAccounts().empty());
  EXPECT_TRUE(weak.expired());
}

TEST_F(ObjectStoreTest, AFailedBufferGivesItsMemoryBackAtOnce) {
  MemoryAccount client("c");
  auto buffer = Buffer(100, BufferOwner{nullptr, &client, nullptr});
  Device* d0 = cluster_->devices()[0];
  EXPECT_EQ(stores_->TotalLiveBytes(), 800);
  ReadyList ready;
  buffer->SetError(absl::InternalError("boom"), &ready);
  EXPECT_EQ(stores_->TotalLiveBytes(), 0);
  EXPECT_EQ(stores_->live_buffers(), 0);
  EXPECT_LE(stores_->For(d0).bytes_in_use(d0), 4);
  EXPECT_EQ(client.live_bytes(), 0);
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(buffer->status(), absl::InternalError("boom"));
  buffer.reset();  // and nothing twice
  EXPECT_EQ(stores_->TotalLiveBytes(), 0);
  EXPECT_EQ(client.live_buffers(), 0);
}

}  // namespace
}  // namespace pw
