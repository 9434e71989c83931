// The prelude every generated kernel starts with (benchmarks/native_compile.py
// pastes it in place of the kernel's `#include "prelude.h"`, as a code
// generator writes its helpers into each kernel's source: the source handed
// to a compiler or lowered to IR is one self-contained string).
//
// Rows are walked in chunks of kChunk floats. A reduction keeps one
// accumulator per position in the chunk (acc[kChunk], updated elementwise:
// a plain loop that vectorizes without -ffast-math, the order of every sum
// fixed by the source) and folds them by halving at the end of the row.
#include <stdint.h>

#define PW_INLINE static inline __attribute__((always_inline))

enum { kChunk = 256 };

// The length of the chunk of a row that starts at column c0.
PW_INLINE int64_t pw_chunk_len(int64_t cols, int64_t c0) {
  return cols - c0 < kChunk ? cols - c0 : kChunk;
}

PW_INLINE void pw_fill(float* acc, float v) {
  for (int64_t i = 0; i < kChunk; ++i) acc[i] = v;
}

PW_INLINE float pw_fold_sum(float* acc) {
  for (int64_t w = kChunk / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) acc[i] += acc[i + w];
  return acc[0];
}

PW_INLINE float pw_fold_max(float* acc) {
  for (int64_t w = kChunk / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) acc[i] = acc[i + w] > acc[i] ? acc[i + w] : acc[i];
  return acc[0];
}

// exp(x), x clamped to [-87, 88] (exp(-87) is 1.6e-38; a softmax's exp
// arguments are <= 0): x = n ln2 + r with n = round(x / ln2) (by adding and
// subtracting 1.5 * 2^23), exp(r) by Cephes' expf polynomial, 2^n by writing
// the exponent bits. Within 2 ulp of expf. Inline, so that the loops calling
// it vectorize and no library call is left for a JIT to resolve.
PW_INLINE float pw_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
