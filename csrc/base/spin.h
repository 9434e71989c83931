#ifndef PATHWAYS_BASE_SPIN_H_
#define PATHWAYS_BASE_SPIN_H_

// Helpers for the short spin-then-sleep waits on the dispatch path. On the
// VMs we run on, waking a sleeping thread on another core costs ~25 us while
// a spin handoff costs ~0.1 us, so waiters spin briefly before they sleep.

#include <chrono>
#include <cstdint>

namespace pw {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Monotonic time in nanoseconds.
inline int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until `done()` is true or `budget_ns` elapses; returns done().
template <typename Pred>
bool SpinUntil(Pred done, int64_t budget_ns) {
  if (done()) return true;
  const int64_t deadline = NowNanos() + budget_ns;
  for (int i = 0;; ++i) {
    for (int k = 0; k < 32; ++k) {
      if (done()) return true;
      CpuRelax();
    }
    if (NowNanos() >= deadline) return done();
  }
}

}  // namespace pw

#endif  // PATHWAYS_BASE_SPIN_H_
