#ifndef PATHWAYS_BASE_BLOCKER_H_
#define PATHWAYS_BASE_BLOCKER_H_

// How a thread that called into the runtime blocks when it must wait (for
// device memory, say). The core says what it waits for; the caller says how
// to wait: the Python bindings release the GIL and run Python's signal
// handlers between slices (bindings/waiting.h), so Ctrl-C ends the wait;
// C++ callers just wait.

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace pw {

class Blocker {
 public:
  virtual ~Blocker() = default;

  // Blocks until `done_within(timeout_ns)` returns true; `done_within` waits
  // up to `timeout_ns` for its condition and says whether it holds. Returns
  // false if the blocker gave up first (the caller was interrupted): the
  // caller then fails with Cancelled and the blocker's owner says why.
  virtual bool Block(absl::FunctionRef<bool(int64_t)> done_within) {
    while (!done_within(kPlainSliceNs)) {
    }
    return true;
  }

  // A blocker that waits until done, for callers that have nothing better.
  static Blocker* Plain() {
    static Blocker plain;
    return &plain;
  }

 protected:
  static constexpr int64_t kPlainSliceNs = 100'000'000;
};

}  // namespace pw

#endif  // PATHWAYS_BASE_BLOCKER_H_
