#ifndef PATHWAYS_KERNELS_SORT_H_
#define PATHWAYS_KERNELS_SORT_H_

// The kSort op's kernel: per row, the positions that sort it (numpy's
// stable argsort).
//
// The output row starts as 0..n-1 and is sorted in place by (key, position),
// a total order, so an unstable in-place sort (std::sort: O(n log n), no
// allocation, unlike std::stable_sort's buffer) gives the stable result, and
// the kernel runs on executor threads as it is. Keys are numpy's order:
// floats by value with -0 equal to +0 and every NaN after +inf, whatever its
// sign or payload (numpy's sort and JAX's, which treat all NaNs as one);
// descending reverses the keys, not the positions, so equal elements keep
// increasing positions (as jax.numpy.argsort(descending=True)).

#include <cstdint>

#include "csrc/base/dtype.h"

namespace pw::kernels {

// For each of `rows` rows of `n` elements of `dtype` (row-major, at `x`),
// writes the positions of its elements in sorted order (ascending, or
// descending when `descending`) to the row's n slots of `out` (rows * n
// int32; n <= INT32_MAX). A bool is one byte, 0 or 1.
void SortRows(DType dtype, int64_t rows, int64_t n, bool descending, const void* x, int32_t* out);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_SORT_H_
