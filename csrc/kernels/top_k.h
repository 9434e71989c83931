#ifndef PATHWAYS_KERNELS_TOP_K_H_
#define PATHWAYS_KERNELS_TOP_K_H_

// The kTopK op's kernel: per row, the positions of the k largest elements.
//
// Each row is scanned once with a heap of its k best positions so far, kept
// in the row's k output slots themselves: O(n log k) comparisons per row of
// n (O(n) when few elements beat the k-th best, as for data in no
// particular order), no scratch and no allocation, so it runs on executor
// threads as it is. The order is XLA's TopK's: larger first, equal elements
// in increasing position, floats by IEEE 754 totalOrder (compared as
// integers: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN).

#include <cstdint>

#include "csrc/base/dtype.h"

namespace pw::kernels {

// For each of `rows` rows of `n` elements of `dtype` (row-major, at `x`),
// writes the positions in the row of its `k` largest elements (0 <= k <= n
// <= INT32_MAX), best first, to the row's k slots of `out` (rows * k int32).
// A bool is one byte, 0 or 1.
void TopKRows(DType dtype, int64_t rows, int64_t n, int64_t k, const void* x, int32_t* out);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_TOP_K_H_
