#include "csrc/scheduler/gang_scheduler.h"

#include <atomic>
#include <algorithm>
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
      : Gang(devices, /*client=*/nullptr, /*cost_ns=*/1000), scheduler_(scheduler), log_(log), queue_(queue) {}

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
  // Not a structured binding: clang 14 cannot capture those in lambdas.
  const int num_submitters = std::get<0>(GetParam()), num_runners = std::get<1>(GetParam());
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

// A gang that records the order in which gangs start.
class OrderGang : public Gang {
 public:
  OrderGang(const DeviceList* devices, SchedulingClient* client, int64_t cost_ns, std::vector<OrderGang*>* started)
      : Gang(devices, client, cost_ns), started_(started) {}
  void Run(RunContext&) override {}
  bool inputs_sequenced = true;
  std::vector<OrderGang*> outputs_for;  // gangs whose inputs this one produces

 protected:
  void OnAtHeadOfAllQueues(ReadyList* ready) override {
    started_->push_back(this);
    ready->Push(this);
  }
  bool InputsSequenced() const override { return inputs_sequenced; }
  void OnSequenced() override {
    for (OrderGang* g : outputs_for) g->inputs_sequenced = true;
  }

 private:
  std::vector<OrderGang*>* started_;
};

// Runs gangs one at a time in the order they become ready; returns how many
// of the first `window` started gangs belong to each client id.
std::vector<int> RunAndCount(GangScheduler& scheduler, std::vector<std::unique_ptr<OrderGang>>& gangs,
                             std::vector<OrderGang*>& started, size_t window) {
  ReadyList ready;
  for (auto& g : gangs) scheduler.Enqueue(g.get(), &ready);
  while (Runnable* r = ready.Pop()) scheduler.Complete(static_cast<Gang*>(r), &ready, 1000);
  std::vector<int> counts(8, 0);
  for (size_t i = 0; i < window && i < started.size(); ++i) counts[started[i]->client()->id()]++;
  return counts;
}

TEST_F(GangSchedulerTest, ProportionalShareFollowsWeights) {
  GangScheduler scheduler(cluster_->islands()[0]);
  ReadyList none;
  scheduler.SetPolicy(SchedulingPolicy::kProportionalShare, &none);
  SchedulingClient light(0, "light", 1.0), heavy(1, "heavy", 3.0);
  const DeviceList* all = List({0, 1, 2, 3, 4, 5, 6, 7});
  std::vector<std::unique_ptr<OrderGang>> gangs;
  std::vector<OrderGang*> started;
  // Both clients backlogged with 400 gangs each, submitted interleaved.
  for (int i = 0; i < 400; ++i) {
    gangs.push_back(std::make_unique<OrderGang>(all, &light, 1000, &started));
    gangs.push_back(std::make_unique<OrderGang>(all, &heavy, 1000, &started));
  }
  std::vector<int> counts = RunAndCount(scheduler, gangs, started, 400);
  EXPECT_EQ(started.size(), 800u);  // everything ran
  // While both are backlogged, device time splits 1:3.
  EXPECT_NEAR(counts[1] / static_cast<double>(counts[0]), 3.0, 0.1) << counts[0] << " vs " << counts[1];
  EXPECT_EQ(scheduler.num_in_flight(), 0);
}

TEST_F(GangSchedulerTest, MinSubmissionInFlightTracksTheOldestUnfinishedGang) {
  GangScheduler scheduler(cluster_->islands()[0]);
  std::vector<OrderGang*> started;
  OrderGang a(List({0}), nullptr, 1000, &started), b(List({1}), nullptr, 1000, &started);
  OrderGang c(List({1}), nullptr, 1000, &started);
  ReadyList ready;
  EXPECT_EQ(scheduler.MinSubmissionInFlight(), 0);
  scheduler.Enqueue(&a, &ready);
  scheduler.Enqueue(&b, &ready);
  scheduler.Enqueue(&c, &ready);
  EXPECT_EQ(scheduler.MinSubmissionInFlight(), 0);
  // Later gangs finishing first (b, then c) do not hide that a is running.
  scheduler.Complete(&b, &ready);
  scheduler.Complete(&c, &ready);
  EXPECT_EQ(scheduler.MinSubmissionInFlight(), 0);
  scheduler.Complete(&a, &ready);
  EXPECT_EQ(scheduler.MinSubmissionInFlight(), 3);
  EXPECT_EQ(scheduler.num_submitted(), 3);
}

TEST_F(GangSchedulerTest, FifoIgnoresWeights) {
  GangScheduler scheduler(cluster_->islands()[0]);
  SchedulingClient light(0, "light", 1.0), heavy(1, "heavy", 3.0);
  const DeviceList* all = List({0, 1, 2, 3});
  std::vector<std::unique_ptr<OrderGang>> gangs;
  std::vector<OrderGang*> started;
  for (int i = 0; i < 100; ++i) {
    gangs.push_back(std::make_unique<OrderGang>(all, &light, 1000, &started));
    gangs.push_back(std::make_unique<OrderGang>(all, &heavy, 1000, &started));
  }
  std::vector<int> counts = RunAndCount(scheduler, gangs, started, 100);
  EXPECT_EQ(counts[0], 50);
  EXPECT_EQ(counts[1], 50);
}

// Under proportional share a gang is admitted only after the producers of
// its inputs, even when they belong to a client with a smaller share: the
// consumer must not take a place ahead of its producer on shared devices.
TEST_F(GangSchedulerTest, ProportionalShareAdmitsProducersFirst) {
  GangScheduler scheduler(cluster_->islands()[0]);
  ReadyList none;
  scheduler.SetPolicy(SchedulingPolicy::kProportionalShare, &none);
  SchedulingClient a(0, "a", 1.0), b(1, "b", 100.0);
  const DeviceList* all = List({0, 1, 2, 3});
  std::vector<std::unique_ptr<OrderGang>> gangs;
  std::vector<OrderGang*> started;
  for (int i = 0; i < 10; ++i) gangs.push_back(std::make_unique<OrderGang>(all, &a, 1000, &started));
  auto consumer = std::make_unique<OrderGang>(all, &b, 1000, &started);
  consumer->inputs_sequenced = false;
  gangs.back()->outputs_for.push_back(consumer.get());  // a's last gang feeds b's
  OrderGang* producer = gangs.back().get();
  gangs.push_back(std::move(consumer));
  RunAndCount(scheduler, gangs, started, 0);
  ASSERT_EQ(started.size(), 11u);
  auto pos = [&](OrderGang* g) { return std::find(started.begin(), started.end(), g) - started.begin(); };
  EXPECT_LT(pos(producer), pos(gangs.back().get()));
}

INSTANTIATE_TEST_SUITE_P(ThreadCounts, GangSchedulerTest,
                         ::testing::Combine(::testing::Values(1, 4, 8), ::testing::Values(1, 2, 4)));

}  // namespace
}  // namespace pw
