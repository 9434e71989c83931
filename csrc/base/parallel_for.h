#ifndef PATHWAYS_BASE_PARALLEL_FOR_H_
#define PATHWAYS_BASE_PARALLEL_FOR_H_

// Splitting one kernel over the executor's threads (XLA:CPU and Eigen split
// a large product or loop over a thread pool the same way).
//
// A kernel calls ParallelFor(n, body): body(i) runs once for every i in
// [0, n), on the calling thread and on whichever other threads of the
// calling thread's pool are free to help. The caller never waits for a
// helper to arrive: it takes pieces itself until none are left, and only
// waits for pieces that a helper has already taken. So a busy pool (other
// gangs, or the shards of one gang as parallel parts) costs nothing but the
// offer, and nothing can deadlock.
//
// A pool's helpers are reusable Runnables submitted to its own queue: a
// helper that runs after the loop it was offered for has ended returns at
// once. One loop per team is split at a time; a second caller, and a body
// that calls ParallelFor itself, run serially.
//
// Threads that belong to no team (tests, host processes' device threads)
// run every loop serially.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "csrc/base/runnable.h"

namespace pw {

class ParallelTeam {
 public:
  // `submit` queues a runnable on the pool's threads; `num_helpers` is the
  // number of the pool's threads besides the caller (0: every loop serial).
  ParallelTeam(absl::AnyInvocable<void(Runnable*)> submit, int num_helpers);
  ParallelTeam(const ParallelTeam&) = delete;
  ParallelTeam& operator=(const ParallelTeam&) = delete;

  // See ParallelFor. Thread-safe.
  void For(int64_t n, absl::FunctionRef<void(int64_t)> body);

  int num_helpers() const { return static_cast<int>(helpers_.size()); }
  // Loops split so far, and pieces run by helpers (for tests and stats).
  int64_t loops_split() const { return loops_split_.load(std::memory_order_relaxed); }
  int64_t pieces_helped() const { return pieces_helped_.load(std::memory_order_relaxed); }

 private:
  class Helper : public Runnable {
   public:
    explicit Helper(ParallelTeam* team) : team_(team) {}
    void Run(RunContext& ctx) override;
    // True from its submission until it starts running: it is not offered
    // twice while it waits in the queue.
    std::atomic<bool> queued{false};

   private:
    ParallelTeam* team_;
  };

  // Runs pieces of the open loop until none are left; returns how many.
  int64_t TakePieces();

  absl::AnyInvocable<void(Runnable*)> submit_;
  std::vector<std::unique_ptr<Helper>> helpers_;
  // One loop at a time: the caller that set it owns body_, n_ and next_.
  std::atomic<bool> busy_{false};
  // kOpen while helpers may join the loop; the low bits count the helpers
  // inside it. The caller closes the loop, then waits for the count to drop
  // to 0 before it returns (and body_ goes out of scope).
  static constexpr uint64_t kOpen = uint64_t{1} << 63;
  std::atomic<uint64_t> state_{0};
  const absl::FunctionRef<void(int64_t)>* body_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> loops_split_{0};
  std::atomic<int64_t> pieces_helped_{0};
};

// body(i) for every i in [0, n), split over the calling thread's team (see
// above). body must not throw. Pieces should each be worth more than a
// hand-off (a few microseconds); loops of one piece run inline.
void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> body);

// How many pieces to cut `work` into on the calling thread: at most
// `per_thread` for each thread of its team (so a helper that arrives late
// still finds pieces), each worth at least `min_piece`; 1 (do not split)
// without a team of two or more threads.
int64_t ParallelPieces(double work, double min_piece, int64_t per_thread);

// The team of the calling thread, or null. Set by the pool for its workers.
ParallelTeam* CurrentParallelTeam();
void SetCurrentParallelTeam(ParallelTeam* team);

}  // namespace pw

#endif  // PATHWAYS_BASE_PARALLEL_FOR_H_
