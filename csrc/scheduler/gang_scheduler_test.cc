#include "csrc/scheduler/gang_scheduler.h"

#include <atomic>
#include <random>
#include <thread>

#include "gtest/gtest.h"

namespace pw {
namespace {

// Records, per device, the sequence numbers of the gangs that ran on it, and
// checks that no two gangs ever occupy one device at the same time.
struct DeviceLog {
  explicit DeviceLog(int n) : busy(n), order(n) {}
  std::vector<std::atomic<int>> busy;
  Mutex mu;
  std::vector<std::vector<uint64_t>> order ABSL_GUARDED_BY(mu);
  std::atomic<int> overlaps{0};
  std::atomic<int> ran{0};
};

// A shared ready queue that runner threads drain.
struct RunQueue {
  Mutex mu;
  ReadyList list ABSL_GUARDED_BY(mu);
  void Push(ReadyList& more) {
    MutexLock lock(&mu);
    list.Splice(more);
  }
  Runnable* Pop() {
    MutexLock lock(&mu);
    return list.Pop();
  }
};

class RecordingGang : public Gang {
 public:
  RecordingGang(const DeviceList* devices, GangScheduler* scheduler, DeviceLog* log, RunQueue* queue)
      : Gang(devices), scheduler_(scheduler), log_(log), queue_(queue) {}

  void Run(RunContext& ctx) override {
    for (Device* d : gang_devices()->devices()) {
      if (log_->busy[d->index_in_island()].fetch_add(1) != 0) log_->overlaps++;
    }
    {
      MutexLock lock(&log_->mu);
      for (Device* d : gang_devices()->devices()) log_->order[d->index_in_island()].push_back(sequence());
    }
    for (Device* d : gang_devices()->devices()) log_->busy[d->index_in_island()].fetch_sub(1);
    log_->ran++;
    scheduler_->Complete(this, ctx.ready);
    delete this;
  }

 protected:
  void OnAtHeadOfAllQueues(ReadyList* ready) override { ready->Push(this); }

 private:
  GangScheduler* scheduler_;
  DeviceLog* log_;
  RunQueue* queue_;
};

class GangSchedulerTest : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  void SetUp() override {
    TopologyOptions options;
    options.num_islands = 1;
    options.hosts_per_island = 2;
    options.devices_per_host = 4;
    cluster_ = *Cluster::Create(options);
  }
  const DeviceList* List(std::vector<int> ids) {
    std::vector<Device*> devs;
    for (int id : ids) devs.push_back(cluster_->devices()[id]);
    return *registry_.Intern(devs);
  }
  std::unique_ptr<Cluster> cluster_;
  DeviceListRegistry registry_;
};

TEST_F(GangSchedulerTest, LaterGangWaitsForHeadOfEveryQueue) {
  GangScheduler scheduler(cluster_->islands()[0]);
  DeviceLog log(8);
  RunQueue queue;
  ReadyList ready;
  auto* a = new RecordingGang(List({0}), &scheduler, &log, &queue);
  auto* b = new RecordingGang(List({0, 1}), &scheduler, &log, &queue);
  auto* c = new RecordingGang(List({1}), &scheduler, &log, &queue);
  scheduler.Enqueue(a, &ready);
  scheduler.Enqueue(b, &ready);
  scheduler.Enqueue(c, &ready);
  // Only a is at the head of all its queues; b waits for device 0, and c
  // (on device 1) is behind b in the island order.
  ASSERT_EQ(ready.Pop(), a);
  EXPECT_TRUE(ready.empty());
  std::vector<uint8_t> scratch;
  RunContext ctx{&ready, &scratch};
  a->Run(ctx);
  ASSERT_EQ(ready.Pop(), b);
  EXPECT_TRUE(ready.empty());
  b->Run(ctx);
  ASSERT_EQ(ready.Pop(), c);
  c->Run(ctx);
  EXPECT_EQ(scheduler.num_in_flight(), 0);
  EXPECT_EQ(scheduler.num_enqueued(), 3u);
  EXPECT_EQ(log.overlaps.load(), 0);
}

// Many submitters enqueue gangs over random overlapping device sets while
// runner threads execute whatever is ready. Every gang must run (no
// deadlock), never two at once on a device, and each device must run its
// gangs in island order.
TEST_P(GangSchedulerTest, ConcurrentSubmittersKeepOneConsistentOrder) {
  const auto [num_submitters, num_runners] = GetParam();
  constexpr int kGangsPerSubmitter = 400;
  GangScheduler scheduler(cluster_->islands()[0]);
  DeviceLog log(8);
  RunQueue queue;
  std::atomic<bool> submitting{true};

  std::vector<std::thread> runners;
  for (int r = 0; r < num_runners; ++r) {
    runners.emplace_back([&] {
      std::vector<uint8_t> scratch;
      ReadyList ready;
      RunContext ctx{&ready, &scratch};
      while (true) {
        Runnable* job = queue.Pop();
        if (job == nullptr) {
          if (!submitting.load() && log.ran.load() == num_submitters * kGangsPerSubmitter) return;
          std::this_thread::yield();
          continue;
        }
        job->Run(ctx);
        queue.Push(ready);
      }
    });
  }
  std::vector<std::thread> submitters;
  for (int s = 0; s < num_submitters; ++s) {
    submitters.emplace_back([&, s] {
      std::mt19937 rng(s);
      for (int i = 0; i < kGangsPerSubmitter; ++i) {
        std::vector<int> ids;
        for (int d = 0; d < 8; ++d) {
          if (rng() % 3 == 0) ids.push_back(d);
        }
        if (ids.empty()) ids.push_back(static_cast<int>(rng() % 8));
        std::shuffle(ids.begin(), ids.end(), rng);
        ReadyList ready;
        scheduler.Enqueue(new RecordingGang(List(ids), &scheduler, &log, &queue), &ready);
        queue.Push(ready);
      }
    });
  }
  for (auto& t : submitters) t.join();
  submitting = false;
  for (auto& t : runners) t.join();

  EXPECT_EQ(log.ran.load(), num_submitters * kGangsPerSubmitter);
  EXPECT_EQ(log.overlaps.load(), 0);
  EXPECT_EQ(scheduler.num_in_flight(), 0);
  MutexLock lock(&log.mu);
  for (const auto& order : log.order) {
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  }
}

INSTANTIATE_TEST_SUITE_P(ThreadCounts, GangSchedulerTest,
                         ::testing::Combine(::testing::Values(1, 4, 8), ::testing::Values(1, 2, 4)));

}  // namespace
}  // namespace pw
