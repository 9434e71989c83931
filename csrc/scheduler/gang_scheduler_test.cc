#include "csrc/scheduler/gang_scheduler.h"

#include <atomic>
#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "csrc/base/spin.h"
#include "csrc/scheduler/hang_watchdog.h"
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

// A gang with names, for diagnosis: its inputs that are not ready and its
// outputs are opaque buffers; it never runs by itself (tests complete it).
class NamedGang : public Gang {
 public:
  NamedGang(const DeviceList* devices, SchedulingClient* client, std::string program, std::string node)
      : Gang(devices, client, /*cost_ns=*/1000), program_(std::move(program)), node_(std::move(node)) {}
  void Run(RunContext&) override {}
  std::vector<std::shared_ptr<int>> pending;  // inputs not ready (set before Enqueue)
  std::vector<std::shared_ptr<int>> outputs;

 protected:
  void OnAtHeadOfAllQueues(ReadyList*) override {}
  const std::string* program_name() const override { return &program_; }
  const std::string* node_name() const override { return &node_; }
  int PendingInputs(std::vector<PendingInput>* out) const override {
    for (size_t i = 0; out != nullptr && i < pending.size(); ++i) {
      PendingInput& in = out->emplace_back();
      in.index = static_cast<int>(i);
      in.type = "f64[2]";
      in.devices = gang_devices();
      in.buffer = pending[i];
    }
    return static_cast<int>(pending.size());
  }
  void AppendOutputs(std::vector<const void*>* out) const override {
    for (const auto& o : outputs) out->push_back(o.get());
  }

 private:
  const std::string program_, node_;
};

const WaitingGang* FindWaiting(const Diagnosis& d, const std::string& node) {
  for (const WaitingGang& w : d.waiting) {
    if (w.gang.node == node) return &w;
  }
  return nullptr;
}

std::vector<int> Ids(const DeviceList* list) {
  std::vector<int> ids;
  for (Device* d : list->devices()) ids.push_back(d->id());
  return ids;
}

// A gang queued behind another on a shared device is reported with the gang
// heading that device's queue named (and whether it runs), device by device.
TEST_F(GangSchedulerTest, DiagnosisNamesTheGangAtTheHeadOfASharedDevice) {
  GangScheduler scheduler(cluster_->islands()[0]);
  SchedulingClient alice(0, "alice", 1.0), bob(1, "bob", 1.0);
  NamedGang hold(List({0, 1}), &alice, "train", "step");
  NamedGang wait(List({1, 2}), &bob, "eval", "score");
  NamedGang behind(List({2, 3}), nullptr, "eval", "post");
  ReadyList ready;
  for (Gang* g : {static_cast<Gang*>(&hold), static_cast<Gang*>(&wait), static_cast<Gang*>(&behind)}) {
    scheduler.Enqueue(g, &ready);
  }
  GangScheduler* schedulers[] = {&scheduler};
  Diagnosis d = Diagnose(schedulers);
  ASSERT_EQ(d.islands.size(), 1u);
  EXPECT_EQ(d.islands[0].running, 1);
  EXPECT_EQ(d.islands[0].queued, 2);
  ASSERT_EQ(d.waiting.size(), 2u);

  const WaitingGang* score = FindWaiting(d, "score");
  ASSERT_NE(score, nullptr);
  EXPECT_EQ(score->gang.program, "eval");
  EXPECT_EQ(score->gang.client, "bob");
  EXPECT_EQ(score->gang.state, GangState::kQueued);
  EXPECT_EQ(Ids(score->gang.devices), (std::vector<int>{1, 2}));
  EXPECT_TRUE(score->inputs.empty());
  ASSERT_EQ(score->blocked_by.size(), 1u);  // device 2's queue: score itself heads it
  EXPECT_EQ(score->blocked_by[0].gang.node, "step");
  EXPECT_EQ(score->blocked_by[0].gang.program, "train");
  EXPECT_EQ(score->blocked_by[0].gang.client, "alice");
  EXPECT_EQ(score->blocked_by[0].gang.state, GangState::kRunning);
  EXPECT_EQ(score->blocked_by[0].device_ids, (std::vector<int>{1}));

  const WaitingGang* post = FindWaiting(d, "post");
  ASSERT_NE(post, nullptr);
  EXPECT_EQ(post->gang.client, "default");
  ASSERT_EQ(post->blocked_by.size(), 1u);
  EXPECT_EQ(post->blocked_by[0].gang.node, "score");
  EXPECT_EQ(post->blocked_by[0].gang.state, GangState::kQueued);
  EXPECT_EQ(post->blocked_by[0].device_ids, (std::vector<int>{2}));

  const std::string text = d.ToString();
  EXPECT_NE(text.find("pathways: 2 gangs waiting to start. island 0: 1 running, 2 queued"), std::string::npos)
      << text;
  EXPECT_NE(text.find("- 'score' of program 'eval', client 'bob' (island 0, gang #1) on island 0 devices [1,2]"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("devices [1]: queue headed by 'step' of program 'train', client 'alice' (island 0, gang #0), "
                      "running"),
            std::string::npos)
      << text;

  // Once the head finishes, the next gang runs and is no longer reported.
  scheduler.Complete(&hold, &ready);
  d = Diagnose(schedulers);
  ASSERT_EQ(d.waiting.size(), 1u);
  EXPECT_EQ(d.waiting[0].gang.node, "post");
  EXPECT_EQ(d.waiting[0].blocked_by[0].gang.state, GangState::kRunning);
  scheduler.Complete(&wait, &ready);
  scheduler.Complete(&behind, &ready);
  d = Diagnose(schedulers);
  EXPECT_TRUE(d.waiting.empty());
  EXPECT_NE(d.ToString().find("0 gangs waiting to start. island 0: idle"), std::string::npos) << d.ToString();
}

// A gang at the head of its queues whose input is not ready holds its
// devices; the input is named with the unfinished gang that produces it.
TEST_F(GangSchedulerTest, DiagnosisNamesAnInputNotReadyAndItsProducer) {
  GangScheduler scheduler(cluster_->islands()[0]);
  NamedGang slow(List({0}), nullptr, "pipeline", "slow");
  NamedGang producer(List({0}), nullptr, "pipeline", "make");  // queued behind slow
  NamedGang consumer(List({1}), nullptr, "pipeline", "use");
  auto x = std::make_shared<int>(0);
  producer.outputs = {x};
  consumer.pending = {x};
  ReadyList ready;
  scheduler.Enqueue(&slow, &ready);
  scheduler.Enqueue(&producer, &ready);
  scheduler.Enqueue(&consumer, &ready);
  GangScheduler* schedulers[] = {&scheduler};
  const Diagnosis d = Diagnose(schedulers);
  EXPECT_EQ(x.use_count(), 3);  // the diagnosis keeps no buffer alive
  const WaitingGang* use = FindWaiting(d, "use");
  ASSERT_NE(use, nullptr);
  EXPECT_EQ(use->gang.state, GangState::kHoldingDevices);
  EXPECT_TRUE(use->blocked_by.empty());
  ASSERT_EQ(use->inputs.size(), 1u);
  EXPECT_EQ(use->inputs[0].index, 0);
  EXPECT_EQ(use->inputs[0].type, "f64[2]");
  ASSERT_TRUE(use->inputs[0].producer.has_value());
  EXPECT_EQ(use->inputs[0].producer->node, "make");
  EXPECT_EQ(use->inputs[0].producer->program, "pipeline");
  EXPECT_EQ(use->inputs[0].producer->state, GangState::kQueued);
  const std::string text = d.ToString();
  EXPECT_NE(text.find("holds its devices, waiting for inputs"), std::string::npos) << text;
  EXPECT_NE(text.find("input 0 (f64[2] on island 0 devices [1]) not ready: produced by 'make' of program "
                      "'pipeline', client 'default' (island 0, gang #1), queued"),
            std::string::npos)
      << text;
  for (Gang* g : {static_cast<Gang*>(&slow), static_cast<Gang*>(&producer), static_cast<Gang*>(&consumer)}) {
    scheduler.Complete(g, &ready);
  }
}

TEST_F(GangSchedulerTest, DiagnosisReportsGangsNotYetAdmitted) {
  GangScheduler scheduler(cluster_->islands()[0]);
  ReadyList ready;
  scheduler.SetPolicy(SchedulingPolicy::kProportionalShare, &ready);
  SchedulingClient tenant(0, "tenant", 1.0);
  std::vector<std::unique_ptr<NamedGang>> gangs;
  for (int i = 0; i < 5; ++i) {
    gangs.push_back(std::make_unique<NamedGang>(List({0, 1}), &tenant, "loop", absl::StrCat("step", i)));
    scheduler.Enqueue(gangs.back().get(), &ready);
  }
  GangScheduler* schedulers[] = {&scheduler};
  const Diagnosis d = Diagnose(schedulers);
  EXPECT_EQ(d.islands[0].running, 1);
  EXPECT_EQ(d.islands[0].queued, 4);
  EXPECT_EQ(d.islands[0].waiting_for_admission, 2);  // the admission window holds 3
  const WaitingGang* last = FindWaiting(d, "step4");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->gang.state, GangState::kWaitingForAdmission);
  ASSERT_EQ(last->blocked_by.size(), 1u);
  EXPECT_EQ(last->blocked_by[0].gang.node, "step0");
  EXPECT_EQ(last->blocked_by[0].device_ids, (std::vector<int>{0, 1}));
  EXPECT_NE(d.ToString().find("(2 not admitted)"), std::string::npos) << d.ToString();
  for (auto& g : gangs) {
    scheduler.Complete(g.get(), &ready);
  }
}

// Taking reports (the watchdog's way) reports a gang once, and only after it
// has waited long enough; on-demand diagnosis always lists it.
TEST_F(GangSchedulerTest, TakingReportsEachWaitingGangOnce) {
  GangScheduler scheduler(cluster_->islands()[0]);
  NamedGang hold(List({0}), nullptr, "a", "hold");
  NamedGang wait(List({0}), nullptr, "b", "wait");
  ReadyList ready;
  scheduler.Enqueue(&hold, &ready);
  scheduler.Enqueue(&wait, &ready);
  GangScheduler* schedulers[] = {&scheduler};
  const int64_t hour = int64_t{3600} * 1'000'000'000;
  EXPECT_TRUE(Diagnose(schedulers, hour, /*take=*/true).waiting.empty());
  const Diagnosis first = Diagnose(schedulers, 0, /*take=*/true);
  ASSERT_EQ(first.waiting.size(), 1u);
  EXPECT_EQ(first.waiting[0].gang.node, "wait");
  EXPECT_TRUE(Diagnose(schedulers, 0, /*take=*/true).waiting.empty());
  EXPECT_EQ(Diagnose(schedulers).waiting.size(), 1u);
  scheduler.Complete(&hold, &ready);
  scheduler.Complete(&wait, &ready);
}

// The watchdog thread reports a gang that cannot start once, names what it
// waits for, reports nothing while nothing waits, and stops promptly.
TEST_F(GangSchedulerTest, HangWatchdogReportsAGangThatCannotStartOnce) {
  GangScheduler scheduler(cluster_->islands()[0]);
  NamedGang hold(List({0, 1}), nullptr, "a", "hold");
  NamedGang wait(List({1}), nullptr, "b", "wait");
  ReadyList ready;
  scheduler.Enqueue(&hold, &ready);
  HangWatchdog watchdog({&scheduler}, /*threshold_ns=*/20'000'000);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // several periods, nothing waiting
  EXPECT_FALSE(watchdog.has_report());
  scheduler.Enqueue(&wait, &ready);
  for (int i = 0; i < 3000 && !watchdog.has_report(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::optional<Diagnosis> report = watchdog.TakeReport();
  ASSERT_TRUE(report.has_value());
  ASSERT_EQ(report->waiting.size(), 1u);
  EXPECT_EQ(report->waiting[0].gang.node, "wait");
  EXPECT_GE(report->waiting[0].waited_ns, 20'000'000);
  ASSERT_EQ(report->waiting[0].blocked_by.size(), 1u);
  EXPECT_EQ(report->waiting[0].blocked_by[0].gang.node, "hold");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // still waiting: not reported again
  EXPECT_FALSE(watchdog.TakeReport().has_value());
  const int64_t start = NowNanos();
  watchdog.Stop();
  EXPECT_LT(NowNanos() - start, 1'000'000'000);
  scheduler.Complete(&hold, &ready);
  scheduler.Complete(&wait, &ready);
}

INSTANTIATE_TEST_SUITE_P(ThreadCounts, GangSchedulerTest,
                         ::testing::Combine(::testing::Values(1, 4, 8), ::testing::Values(1, 2, 4)));

}  // namespace
}  // namespace pw
