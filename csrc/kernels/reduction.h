#ifndef PATHWAYS_KERNELS_REDUCTION_H_
#define PATHWAYS_KERNELS_REDUCTION_H_

// numpy's sum, mean, max, min and argmax over some axes of each shard.

#include <cstdint>

#include "absl/types/span.h"

#include "csrc/function_ir/function_ir.h"
#include "csrc/kernels/kernel_util.h"

namespace pw::kernels {

// How a kReduce op walks its operand (one shard): result element o and
// reduced element r (both row-major over their dims) read the operand at
// offset(o, kept_dims, kept_strides) + offset(r, red_dims, red_strides).
//
// Most reductions are over contiguous runs after merging dimensions, and
// take a fast path: kRows when the operand is [outer, red] (the reduced
// axes are the last ones: softmax, layer norm), kColumns when it is
// [outer, red, inner] (the reduced axes are together, with kept axes after
// them: a bias's gradient summed over the batch).
struct ReducePlan {
  Dims kept_dims, kept_strides;
  Dims red_dims, red_strides;
  int64_t red_count = 1;
  enum class Layout : uint8_t { kGeneral, kRows, kColumns };
  Layout layout = Layout::kGeneral;
  int64_t outer = 1, inner = 1;  // kRows, kColumns (red = red_count)
};

// The plan of a reduction of an operand of `in` dims over `axes` (sorted,
// distinct, in range).
ReducePlan MakeReducePlan(const Dims& in, absl::Span<const int64_t> axes);

// Runs reduction `kind` of `x` (of `in_dtype`) into `out` (`n` elements per
// shard) over `num_shards` shards.
void RunReduce(ReduceKind kind, DType in_dtype, int num_shards, int64_t n, const View& x,
               const ReducePlan& plan, void* out);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_REDUCTION_H_
