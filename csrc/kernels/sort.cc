#include "csrc/kernels/sort.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

namespace pw::kernels {
namespace {

// Integers in numpy's sort order. A float's bits as a signed integer order
// the non-negative floats; flipping all but the sign bit of the negative
// ones reverses theirs (IEEE totalOrder). Zeros are made +0 and NaNs the
// largest key first, so that they compare equal among themselves.
inline int32_t SortKey(float v) {
  if (std::isnan(v)) return std::numeric_limits<int32_t>::max();
  const int32_t b = std::bit_cast<int32_t>(v == 0 ? 0.0f : v);
  return b ^ ((b >> 31) & std::numeric_limits<int32_t>::max());
}
inline int64_t SortKey(double v) {
  if (std::isnan(v)) return std::numeric_limits<int64_t>::max();
  const int64_t b = std::bit_cast<int64_t>(v == 0 ? 0.0 : v);
  return b ^ ((b >> 63) & std::numeric_limits<int64_t>::max());
}
inline int32_t SortKey(int32_t v) { return v; }
inline uint32_t SortKey(uint32_t v) { return v; }
inline int32_t SortKey(uint8_t v) { return v; }  // bool

template <typename T>
void SortRowsOf(int64_t rows, int64_t n, bool descending, const T* x, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    int32_t* pos = out + r * n;
    std::iota(pos, pos + n, 0);
    if (descending) {
      std::sort(pos, pos + n, [row](int32_t a, int32_t b) {
        const auto ka = SortKey(row[a]);
        const auto kb = SortKey(row[b]);
        return ka > kb || (ka == kb && a < b);
      });
    } else {
      std::sort(pos, pos + n, [row](int32_t a, int32_t b) {
        const auto ka = SortKey(row[a]);
        const auto kb = SortKey(row[b]);
        return ka < kb || (ka == kb && a < b);
      });
    }
  }
}

}  // namespace

void SortRows(DType dtype, int64_t rows, int64_t n, bool descending, const void* x, int32_t* out) {
  switch (dtype) {
    case DType::kF32:
      return SortRowsOf(rows, n, descending, static_cast<const float*>(x), out);
    case DType::kF64:
      return SortRowsOf(rows, n, descending, static_cast<const double*>(x), out);
    case DType::kI32:
      return SortRowsOf(rows, n, descending, static_cast<const int32_t*>(x), out);
    case DType::kU32:
      return SortRowsOf(rows, n, descending, static_cast<const uint32_t*>(x), out);
    case DType::kBool:
      return SortRowsOf(rows, n, descending, static_cast<const uint8_t*>(x), out);
    case DType::kBF16:  // sorted in float32 (the builder widens it)
      return;
  }
}

}  // namespace pw::kernels
