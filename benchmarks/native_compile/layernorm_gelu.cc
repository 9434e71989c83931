// y = h + gelu(layer_norm(h) * gamma + beta), h = x + r, over the last axis of
// [rows, cols] float32 arrays (gamma, beta: [cols]): the larger of the two
// kernels, some 25 fused ops, written the way a fusion code generator emits
// them (one temporary per op; helpers in prelude.h). Three passes over each
// row, in chunks of kChunk floats:
//   1. h = x + r, stored in y; sum(h)
//   2. sum((h - mean)^2)
//   3. a = (h - mean) * rstd * gamma + beta;
//      y = h + 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))
// with tanh(z) = 1 - 2 / (exp(2z) + 1), z clamped to [-9, 9].
#include "prelude.h"

extern "C" void kernel(int64_t rows, int64_t cols, const float* __restrict__ x,
                       const float* __restrict__ r, const float* __restrict__ gamma,
                       const float* __restrict__ beta, float* __restrict__ y) {
  float acc[kChunk];
  const float inv_cols = 1.0f / (float)cols;
  for (int64_t row = 0; row < rows; ++row) {
    const float* __restrict__ xr = x + row * cols;
    const float* __restrict__ rr = r + row * cols;
    float* __restrict__ yr = y + row * cols;

    // Pass 1: h = x + r (kept in y), sum(h).
    pw_fill(acc, 0.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = pw_chunk_len(cols, c0);
      for (int64_t i = 0; i < n; ++i) {
        const float t0 = xr[c0 + i];
        const float t1 = rr[c0 + i];
        const float t2 = t0 + t1;
        yr[c0 + i] = t2;
        acc[i] += t2;
      }
    }
    const float mean = pw_fold_sum(acc) * inv_cols;

    // Pass 2: sum((h - mean)^2).
    pw_fill(acc, 0.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = pw_chunk_len(cols, c0);
      for (int64_t i = 0; i < n; ++i) {
        const float t3 = yr[c0 + i] - mean;
        acc[i] += t3 * t3;
      }
    }
    const float var = pw_fold_sum(acc) * inv_cols;
    const float rstd = 1.0f / __builtin_sqrtf(var + 1e-5f);

    // Pass 3: normalize, scale and shift, GELU (tanh form), residual.
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = pw_chunk_len(cols, c0);
      for (int64_t i = 0; i < n; ++i) {
        const float t4 = yr[c0 + i];
        const float t5 = t4 - mean;
        const float t6 = t5 * rstd;
        const float t7 = gamma[c0 + i];
        const float t8 = beta[c0 + i];
        const float t9 = t6 * t7;
        const float t10 = t9 + t8;
        const float t11 = t10 * t10;
        const float t12 = t11 * t10;
        const float t13 = t12 * 0.044715f;
        const float t14 = t10 + t13;
        const float t15 = t14 * 0.7978845608028654f;
        const float t16 = t15 < -9.0f ? -9.0f : t15;
        const float t17 = t16 > 9.0f ? 9.0f : t16;
        const float t18 = t17 * 2.0f;
        const float t19 = pw_exp(t18);
        const float t20 = t19 + 1.0f;
        const float t21 = 2.0f / t20;
        const float t22 = 1.0f - t21;
        const float t23 = t22 + 1.0f;
        const float t24 = t10 * 0.5f;
        const float t25 = t24 * t23;
        const float t26 = t4 + t25;
        yr[c0 + i] = t26;
      }
    }
  }
}
