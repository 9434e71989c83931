// An empty kernel: what starting the toolchain (or ORC's per-module work)
// costs with next to nothing to compile (the prelude's inline helpers only).
// benchmarks/native_compile.py compiles it by every path, as it does the
// real kernels, and does not run it.
#include "prelude.h"

extern "C" void kernel(int64_t rows, int64_t cols, const float* __restrict__ x,
                       float* __restrict__ y) {
  (void)rows;
  (void)cols;
  (void)x;
  (void)y;
}
