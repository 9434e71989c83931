#ifndef PATHWAYS_KERNELS_ELEMENTWISE_H_
#define PATHWAYS_KERNELS_ELEMENTWISE_H_

// Elementwise kernels: casts and bitcasts, unary, binary, comparisons and select, over
// the shards of a gang (numpy broadcasting and promotion, as the builder
// typed them), and the kernels' classification of those ops.

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "csrc/function_ir/function_ir.h"
#include "csrc/kernels/kernel_util.h"

namespace pw::kernels {

// How the operands of one op broadcast against its result when some
// operand is neither of the result's shape nor a scalar (numpy
// broadcasting). Computed by Compile, so Run() only reads it.
struct BroadcastPlan {
  Dims dims;     // the result's dims (rank >= 1)
  Dims row_div;  // per dim d < rank-1: number of rows (of dims.back()) per step of d
  absl::InlinedVector<Dims, 3> strides;  // per operand, per result dim: element stride
};

// The kernels' view of the op registry (op_registry.h).
// Elementwise binary ops whose result has the operands' (promoted) type.
bool IsBinaryKind(OpKind kind);
bool IsComparisonKind(OpKind kind);
// Unary elementwise ops; simulated_compute runs as a unary identity (its
// time is the executor's).
bool IsUnaryKind(OpKind kind);
// Everything RunElementwise runs.
bool IsElementwiseKind(OpKind kind);

// Runs a kConvert, kBitcastConvert, unary, binary, comparison or select op (operands x, y, z
// as the op has them; `in_dtype` is x's) over `num_shards` shards of `n`
// elements each into `out`. `plan` is the op's broadcast plan, or null when
// every operand is of the result's shape or a scalar.
void RunElementwise(const Op& op, DType in_dtype, int num_shards, int64_t n, View x, View y,
                    View z, void* out, const BroadcastPlan* plan);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_ELEMENTWISE_H_
