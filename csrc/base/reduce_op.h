#ifndef PATHWAYS_BASE_REDUCE_OP_H_
#define PATHWAYS_BASE_REDUCE_OP_H_

#include <cstdint>

namespace pw {

// The elementwise reductions of an all-reduce, shared by the kernels (a
// gang's psum / pmax / pmin across hosts, see GangCollectives) and the
// cross-host collectives that carry them (CollectiveGroup::AllReduce).
// Floats follow numpy.maximum/minimum: a NaN anywhere wins. int32 sums wrap
// (two's complement), as XLA's do. bool: kMax is logical or, kMin logical
// and; there is no kSum of bool (JAX's psum sums bools as int32, and so does
// FunctionBuilder::Psum; a kernel's psum of a bool value is a logical or:
// kMax).
enum class ReduceOp : uint8_t { kSum, kMax, kMin };

}  // namespace pw

#endif  // PATHWAYS_BASE_REDUCE_OP_H_
