#include "csrc/base/parallel_for.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pw {
namespace {

// A minimal pool for the team's helpers: `threads` threads run what is
// submitted, in order. Held (`Hold`) submissions wait until released.
class TestPool {
 public:
  explicit TestPool(int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] {
        std::vector<uint8_t> scratch;
        ReadyList local;
        RunContext ctx{&local, &scratch};
        std::unique_lock<std::mutex> lock(mu_);
        while (true) {
          cv_.wait(lock, [&] { return stop_ || (!held_ && !queue_.empty()); });
          if (queue_.empty() || held_) return;
          Runnable* r = queue_.front();
          queue_.pop_front();
          lock.unlock();
          r->Run(ctx);
          lock.lock();
        }
      });
    }
  }
  ~TestPool() { Stop(); }
  // Runs what is queued, then joins the threads. Called before the team
  // goes away: a helper may still be running when its loop has returned.
  void Stop() {
    Release();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  void Submit(Runnable* r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(r);
    }
    cv_.notify_one();
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Runnable*> queue_;
  bool held_ = false;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Runs every index of [0, n) through the team from this thread and checks
// that each ran exactly once.
void ExpectEachIndexOnce(ParallelTeam& team, int64_t n) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  team.For(n, [&](int64_t i) {
    // A little work, so that helpers have time to join.
    volatile double x = 0;
    for (int k = 0; k < 200; ++k) x = x + k;
    runs[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "index " << i;
}

TEST(ParallelForTest, EveryIndexRunsOnceAndHelpersTakePieces) {
  TestPool pool(2);
  ParallelTeam team([&](Runnable* r) { pool.Submit(r); }, 2);
  EXPECT_EQ(team.num_helpers(), 2);
  for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
    for (int round = 0; round < 50; ++round) {
      ExpectEachIndexOnce(team, n);
      if (HasFatalFailure()) return pool.Stop();
    }
  }
  pool.Stop();
  // Loops of 0 or 1 pieces are not split; the other 4 x 50 are.
  EXPECT_EQ(team.loops_split(), 200);
  // Not guaranteed for any one loop, but over 50 loops of 1000 pieces the
  // helpers take some.
  EXPECT_GT(team.pieces_helped(), 0);
}

TEST(ParallelForTest, ConcurrentCallersEachGetEveryIndexOnce) {
  TestPool pool(2);
  ParallelTeam team([&](Runnable* r) { pool.Submit(r); }, 2);
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 100; ++round) ExpectEachIndexOnce(team, 200);
    });
  }
  for (std::thread& c : callers) c.join();
  pool.Stop();
}

TEST(ParallelForTest, NestedLoopRunsSeriallyInsideTheBody) {
  TestPool pool(1);
  ParallelTeam team([&](Runnable* r) { pool.Submit(r); }, 1);
  SetCurrentParallelTeam(&team);
  std::vector<std::atomic<int>> runs(100);
  ParallelFor(10, [&](int64_t i) {
    const std::thread::id self = std::this_thread::get_id();
    ParallelFor(10, [&](int64_t j) {
      EXPECT_EQ(std::this_thread::get_id(), self);  // serial: the body's own thread
      runs[static_cast<size_t>(i * 10 + j)].fetch_add(1);
    });
  });
  SetCurrentParallelTeam(nullptr);
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
  pool.Stop();
}

TEST(ParallelForTest, WithoutATeamRunsInOrderOnTheCallingThread) {
  ASSERT_EQ(CurrentParallelTeam(), nullptr);
  std::vector<int64_t> order;
  ParallelFor(5, [&](int64_t i) { order.push_back(i); });  // no lock: one thread
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(ParallelForTest, PiecesAreBoundedByTheTeamAndTheWork) {
  ASSERT_EQ(CurrentParallelTeam(), nullptr);
  EXPECT_EQ(ParallelPieces(1e9, 1.0, 3), 1);  // no team: no split
  ParallelTeam team([](Runnable*) {}, 2);      // 3 threads
  SetCurrentParallelTeam(&team);
  EXPECT_EQ(ParallelPieces(1e9, 1.0, 3), 9);   // 3 per thread
  EXPECT_EQ(ParallelPieces(50.0, 10.0, 3), 5);  // each worth 10
  EXPECT_EQ(ParallelPieces(5.0, 10.0, 3), 1);   // too little to split
  SetCurrentParallelTeam(nullptr);
}

TEST(ParallelForTest, NoHelpersMeansSerial) {
  int submitted = 0;
  ParallelTeam team([&](Runnable*) { ++submitted; }, 0);
  std::vector<int64_t> order;
  team.For(4, [&](int64_t i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(submitted, 0);
  EXPECT_EQ(team.loops_split(), 0);
}

TEST(ParallelForTest, AHelperThatRunsAfterTheLoopEndedReturnsAtOnce) {
  TestPool pool(1);
  pool.Hold();  // the helper stays queued until the loop is over
  ParallelTeam team([&](Runnable* r) { pool.Submit(r); }, 1);
  std::atomic<int> calls{0};
  team.For(8, [&](int64_t) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 8);  // all on the caller
  // A second loop while the helper is still queued: it is not queued twice.
  team.For(8, [&](int64_t) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 16);
  pool.Release();
  pool.Stop();
  EXPECT_EQ(calls.load(), 16);  // the late helper ran no piece
  EXPECT_EQ(team.pieces_helped(), 0);
  EXPECT_EQ(team.loops_split(), 2);
}

}  // namespace
}  // namespace pw
