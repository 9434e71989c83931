#include "csrc/base/parallel_for.h"

#include <algorithm>
#include <utility>

#include "csrc/base/spin.h"

namespace pw {
namespace {

thread_local ParallelTeam* current_team = nullptr;

}  // namespace

ParallelTeam* CurrentParallelTeam() { return current_team; }
void SetCurrentParallelTeam(ParallelTeam* team) { current_team = team; }

void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> body) {
  if (n > 1) {
    if (ParallelTeam* team = current_team; team != nullptr) {
      team->For(n, body);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) body(i);
}

int64_t ParallelPieces(double work, double min_piece, int64_t per_thread) {
  const ParallelTeam* team = current_team;
  if (team == nullptr || team->num_helpers() == 0) return 1;
  const double most = static_cast<double>((team->num_helpers() + 1) * per_thread);
  return std::max<int64_t>(1, static_cast<int64_t>(std::min(most, work / min_piece)));
}

ParallelTeam::ParallelTeam(absl::AnyInvocable<void(Runnable*)> submit, int num_helpers)
    : submit_(std::move(submit)) {
  for (int i = 0; i < num_helpers; ++i) helpers_.push_back(std::make_unique<Helper>(this));
}

int64_t ParallelTeam::TakePieces() {
  const absl::FunctionRef<void(int64_t)>& body = *body_;
  int64_t taken = 0;
  for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    body(i);
    ++taken;
  }
  return taken;
}

void ParallelTeam::For(int64_t n, absl::FunctionRef<void(int64_t)> body) {
  // Serial: no helpers, or another loop (or this body's caller) holds the team.
  if (n <= 1 || helpers_.empty() || busy_.exchange(true, std::memory_order_acquire)) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  body_ = &body;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  // Publishes body_, n_ and next_ to the helpers that join.
  state_.store(kOpen, std::memory_order_release);
  const int64_t offers = std::min<int64_t>(n - 1, static_cast<int64_t>(helpers_.size()));
  for (int64_t h = 0; h < offers; ++h) {
    Helper& helper = *helpers_[static_cast<size_t>(h)];
    if (!helper.queued.exchange(true, std::memory_order_acquire)) submit_(&helper);
  }
  // While this thread runs body, a nested ParallelFor finds busy_ set and
  // runs serially.
  TakePieces();
  // No helper joins from now on; wait for those inside to finish their last
  // piece (their acquire-release pairs with this acquire: their writes are
  // visible to the caller).
  state_.fetch_and(~kOpen, std::memory_order_relaxed);
  while (state_.load(std::memory_order_acquire) != 0) CpuRelax();
  loops_split_.fetch_add(1, std::memory_order_relaxed);
  body_ = nullptr;
  busy_.store(false, std::memory_order_release);
}

void ParallelTeam::Helper::Run(RunContext& /*ctx*/) {
  // Release: this thread's last write to the runnable (the queue's pop) comes
  // before a resubmission's.
  queued.store(false, std::memory_order_release);
  ParallelTeam& team = *team_;
  uint64_t s = team.state_.load(std::memory_order_relaxed);
  do {
    if ((s & kOpen) == 0) return;  // the loop ended before this helper ran
  } while (!team.state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                              std::memory_order_relaxed));
  const int64_t taken = team.TakePieces();
  if (taken > 0) team.pieces_helped_.fetch_add(taken, std::memory_order_relaxed);
  team.state_.fetch_sub(1, std::memory_order_release);
}

}  // namespace pw
