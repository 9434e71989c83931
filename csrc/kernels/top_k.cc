#include "csrc/kernels/top_k.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

namespace pw::kernels {
namespace {

// Integers in the order top_k ranks elements. A float's bits as a signed
// integer order the non-negative floats; flipping all but the sign bit of
// the negative ones reverses theirs. That is IEEE totalOrder, XLA's.
inline int32_t OrderKey(float v) {
  const int32_t b = std::bit_cast<int32_t>(v);
  return b ^ ((b >> 31) & std::numeric_limits<int32_t>::max());
}
inline int64_t OrderKey(double v) {
  const int64_t b = std::bit_cast<int64_t>(v);
  return b ^ ((b >> 63) & std::numeric_limits<int64_t>::max());
}
inline int32_t OrderKey(int32_t v) { return v; }
inline uint32_t OrderKey(uint32_t v) { return v; }
inline int32_t OrderKey(uint8_t v) { return v; }  // bool

// Puts `v` in place of the top of the heap `heap[0, k)` (its worst position
// by `before`) and sifts it down: one pass, half of a pop_heap + push_heap.
template <typename Before>
void ReplaceTop(int32_t* heap, int64_t k, int32_t v, const Before& before) {
  int64_t hole = 0;
  for (;;) {
    int64_t child = 2 * hole + 1;
    if (child >= k) break;
    if (child + 1 < k && before(heap[child], heap[child + 1])) ++child;  // the worse child
    if (!before(v, heap[child])) break;
    heap[hole] = heap[child];
    hole = child;
  }
  heap[hole] = v;
}

template <typename T>
void TopKRowsOf(int64_t rows, int64_t n, int64_t k, const T* x, int32_t* out) {
  if (k == 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    int32_t* heap = out + r * k;
    // Whether position a ranks before position b.
    auto before = [row](int32_t a, int32_t b) {
      const auto ka = OrderKey(row[a]);
      const auto kb = OrderKey(row[b]);
      return ka > kb || (ka == kb && a < b);
    };
    // A heap by `before` has its worst position on top: the one a later
    // element must beat to get in.
    for (int32_t i = 0; i < k; ++i) heap[i] = i;
    std::make_heap(heap, heap + k, before);
    auto worst = OrderKey(row[heap[0]]);
    for (int64_t i = k; i < n; ++i) {
      const auto key = OrderKey(row[i]);
      // Strictly: a later position does not beat an equal element.
      if (key <= worst) continue;
      ReplaceTop(heap, k, static_cast<int32_t>(i), before);
      worst = OrderKey(row[heap[0]]);
    }
    std::sort_heap(heap, heap + k, before);
  }
}

}  // namespace

void TopKRows(DType dtype, int64_t rows, int64_t n, int64_t k, const void* x, int32_t* out) {
  switch (dtype) {
    case DType::kF32:
      return TopKRowsOf(rows, n, k, static_cast<const float*>(x), out);
    case DType::kF64:
      return TopKRowsOf(rows, n, k, static_cast<const double*>(x), out);
    case DType::kI32:
      return TopKRowsOf(rows, n, k, static_cast<const int32_t*>(x), out);
    case DType::kU32:
      return TopKRowsOf(rows, n, k, static_cast<const uint32_t*>(x), out);
    case DType::kBool:
      return TopKRowsOf(rows, n, k, static_cast<const uint8_t*>(x), out);
  }
}

}  // namespace pw::kernels
