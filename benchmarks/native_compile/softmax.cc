// softmax over the last axis of a [rows, cols] float32 array, written the way
// a fusion code generator emits it (one temporary per op; helpers in
// prelude.h). Three passes over each row, in chunks of kChunk floats:
//   1. m = max(x)
//   2. y = exp(x - m), s = sum(y)
//   3. y = y * (1 / s)
#include "prelude.h"

extern "C" void kernel(int64_t rows, int64_t cols, const float* __restrict__ x,
                       float* __restrict__ y) {
  float acc[kChunk];
  for (int64_t row = 0; row < rows; ++row) {
    const float* __restrict__ xr = x + row * cols;
    float* __restrict__ yr = y + row * cols;

    // Pass 1: max.
    pw_fill(acc, -__builtin_inff());
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = pw_chunk_len(cols, c0);
      for (int64_t i = 0; i < n; ++i) {
        const float t0 = xr[c0 + i];
        acc[i] = t0 > acc[i] ? t0 : acc[i];
      }
    }
    const float mx = pw_fold_max(acc);

    // Pass 2: y = exp(x - max), sum.
    pw_fill(acc, 0.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = pw_chunk_len(cols, c0);
      for (int64_t i = 0; i < n; ++i) {
        const float t1 = xr[c0 + i];
        const float t2 = t1 - mx;
        const float t3 = pw_exp(t2);
        yr[c0 + i] = t3;
        acc[i] += t3;
      }
    }
    const float inv = 1.0f / pw_fold_sum(acc);

    // Pass 3: scale.
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = pw_chunk_len(cols, c0);
      for (int64_t i = 0; i < n; ++i) yr[c0 + i] = yr[c0 + i] * inv;
    }
  }
}
