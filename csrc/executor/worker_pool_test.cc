#include "csrc/executor/worker_pool.h"

#include "csrc/base/parallel_for.h"
#include "csrc/base/spin.h"
#include "csrc/executor/delay_queue.h"

#include <atomic>
#include <thread>
#include <tuple>

#include "gtest/gtest.h"

namespace pw {
namespace {

// A job that, when run, makes `fanout` more jobs ready until `depth` is 0.
class TreeJob : public Runnable {
 public:
  TreeJob(int depth, int fanout, std::atomic<int64_t>* count) : depth_(depth), fanout_(fanout), count_(count) {}
  void Run(RunContext& ctx) override {
    count_->fetch_add(1);
    if (depth_ > 0) {
      for (int i = 0; i < fanout_; ++i) ctx.ready->Push(new TreeJob(depth_ - 1, fanout_, count_));
    }
    delete this;
  }

 private:
  int depth_, fanout_;
  std::atomic<int64_t>* count_;
};

void WaitFor(const std::atomic<int64_t>& count, int64_t want) {
  for (int i = 0; i < 200000 && count.load() < want; ++i) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

class WorkerPoolTest : public ::testing::TestWithParam<int> {};

TEST_P(WorkerPoolTest, RunsEveryJobIncludingOnesMadeReadyByJobs) {
  WorkerPool pool(GetParam());
  std::atomic<int64_t> count{0};
  // 1 + 3 + 9 + ... + 3^7 jobs.
  pool.Submit(new TreeJob(7, 3, &count));
  const int64_t want = (2187 * 3 - 1) / 2;
  WaitFor(count, want);
  EXPECT_EQ(count.load(), want);
}

TEST_P(WorkerPoolTest, ManySubmitterThreads) {
  WorkerPool pool(GetParam(), /*spin_ns=*/1000);
  std::atomic<int64_t> count{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < 8; ++t) {
    submitters.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        pool.Submit(new TreeJob(0, 0, &count));
        if (i % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // let workers sleep
      }
    });
  }
  for (auto& t : submitters) t.join();
  WaitFor(count, 16000);
  EXPECT_EQ(count.load(), 16000);
}

TEST_P(WorkerPoolTest, DestructorDrainsQueuedWork) {
  std::atomic<int64_t> count{0};
  {
    WorkerPool pool(GetParam());
    for (int i = 0; i < 1000; ++i) pool.Submit(new TreeJob(1, 2, &count));
  }
  EXPECT_EQ(count.load(), 3000);
}

class StampJob : public Runnable {
 public:
  StampJob(int id, std::vector<std::pair<int, int64_t>>* log) : id_(id), log_(log) {}
  void Run(RunContext&) override { log_->emplace_back(id_, NowNanos()); }

 private:
  int id_;
  std::vector<std::pair<int, int64_t>>* log_;
};

// A job's kernels may split over `intra_op_threads` of the pool's threads:
// the team a worker offers them has one thread fewer as helpers.
TEST(WorkerPoolTest, IntraOpThreadsSizeTheTeamKernelsSplitOver) {
  for (auto [threads, intra, helpers] : {std::tuple{3, 0, 2}, {3, 1, 0}, {3, 2, 1}, {3, 9, 2}, {1, 0, 0}}) {
    WorkerPool pool(threads, WorkerPool::kDefaultSpinNs, intra);
    struct Probe : Runnable {
      std::atomic<int> helpers{-1};
      void Run(RunContext&) override { helpers.store(CurrentParallelTeam()->num_helpers()); }
    } probe;
    pool.Submit(&probe);
    while (probe.helpers.load() < 0) std::this_thread::yield();
    EXPECT_EQ(probe.helpers.load(), helpers) << threads << " threads, intra_op_threads " << intra;
  }
}

TEST(DelayQueueTest, RunsJobsInDeadlineOrderNotBefore) {
  std::vector<std::pair<int, int64_t>> log;  // written by the delay thread only
  std::vector<std::unique_ptr<StampJob>> jobs;
  std::vector<int64_t> deadlines;
  {
    DelayQueue queue;
    // Every deadline lies 50 ms ahead, so all six are queued before the first
    // is due however slowly this thread runs (a push that came after a due
    // deadline would rightly run later, and the order would say nothing).
    const int64_t t0 = NowNanos() + 50'000'000;
    const int64_t offsets_us[] = {3000, 500, 2000, 500, 0, 8000};
    for (int i = 0; i < 6; ++i) {
      jobs.push_back(std::make_unique<StampJob>(i, &log));
      deadlines.push_back(t0 + offsets_us[i] * 1000);
      queue.RunAt(deadlines.back(), jobs.back().get());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(70));
  }  // destructor joins the thread: `log` is complete
  ASSERT_EQ(log.size(), 6u);
  const std::vector<int> want_order = {4, 1, 3, 2, 0, 5};  // by deadline, FIFO among equals
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i].first, want_order[i]);
    EXPECT_GE(log[i].second, deadlines[log[i].first]);  // never early
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, WorkerPoolTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace pw
