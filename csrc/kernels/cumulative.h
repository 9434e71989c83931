#ifndef PATHWAYS_KERNELS_CUMULATIVE_H_
#define PATHWAYS_KERNELS_CUMULATIVE_H_

// The kCumulative op's kernel: running sums, products, maxima and minima
// along one axis (numpy's cumsum, cumprod and ufunc.accumulate).
//
// The value is [outer, dim, inner] around the axis; each step along the axis
// combines a whole inner row with the previous one, so the loop over inner
// elements vectorizes, and a sum is accumulated in order as numpy's cumsum
// does (no reassociation: the same float rounding). No allocation.

#include <cstdint>

#include "csrc/base/dtype.h"
#include "csrc/function_ir/function_ir.h"

namespace pw::kernels {

// out[o, j, i] = x[o, 0, i] (+) ... (+) x[o, j, i] for `combiner` (+) (add,
// mul, max, min; not set), or x[o, j, i] (+) ... (+) x[o, dim-1, i] when
// `reverse`. int32 sums and products wrap; max and min propagate NaN; for
// bool, max is or and min is and. x and out hold outer * dim * inner
// elements of `dtype` and do not overlap.
void CumulativeRows(Combiner combiner, DType dtype, int64_t outer, int64_t dim, int64_t inner,
                    bool reverse, const void* x, void* out);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_CUMULATIVE_H_
