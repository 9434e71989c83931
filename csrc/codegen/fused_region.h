#ifndef PATHWAYS_CODEGEN_FUSED_REGION_H_
#define PATHWAYS_CODEGEN_FUSED_REGION_H_

// Loop fusion for native code, as XLA's CPU backend fuses: a fused region is
// a run of consecutive ops of a compiled function (elementwise ops, numpy
// broadcasting, reshapes, broadcast_to, and reductions over trailing axes)
// that one generated loop nest computes, reading each input from memory
// once and writing each output once.
//
// The loop space. A region has a reference shape L (its largest value) split
// into rows and columns: L = [rows dims..., column dims...], so a value is
// addressed by (shard, row, column). Every value of the region is one of
//   kFull    an element per (row, column): x, exp(x - m), the output;
//   kRow     an element per row: a reduction's result, its mean, rsqrt(var);
//   kCol     an element per column: layer norm's gamma and beta;
//   kScalar  one element: a learning rate, a literal;
// decided by how it broadcasts against L (numpy's rules, reshapes keeping
// the element order). A reduction's axes are the column dims, so softmax,
// layer norm and a loss are one region each. Per row, the generated code
// makes one pass over the columns per level of reductions (softmax: max,
// then exp and sum, then the division); a value a later pass reads again
// (the summands of a sum, x - mean) is kept in a row buffer of the region's
// (in cache, never written to memory), so each input is read from memory
// once. Row values are computed once per row.
//
// The same bits as the interpreter (kernels/function_executable.h): the
// elementwise ops are kernels/scalar_ops.h's functions (the generated file
// embeds that header), transcendentals call the runtime's vector math
// through PwVectorMath (native_abi.h), each op's result is rounded to its
// type (no contraction into fused multiply-adds: -ffp-contract=off), and a
// reduction runs over its row buffer with the interpreter's own order
// (PairwiseSum, RunMax).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "csrc/function_ir/function_ir.h"

namespace pw::codegen {

enum class Access : uint8_t { kFull, kRow, kCol, kScalar };

// A value the region reads from memory (a parameter, a constant that is not
// a scalar, a value computed before the region) or writes (a value used
// after the region or returned by the function).
struct RegionIo {
  int32_t value = -1;  // the op whose memory is read or written
  Access access = Access::kFull;
  DType dtype = DType::kF32;
};

// The most inputs, or outputs, of one region (the runtime passes their
// pointers in fixed arrays).
inline constexpr size_t kMaxRegionIo = 32;

struct FusedRegion {
  int32_t first = 0, last = 0;  // the ops [first, last] (parameters and constants compute nothing)
  int64_t rows = 1, cols = 1;   // per shard
  std::vector<RegionIo> inputs, outputs;
  int64_t row_buffer_bytes = 0;  // on the stack of each call
  // Which blocks of the loop space calls may split it into: rows, unless an
  // output has one element per column or one in all (every row writes it);
  // columns, unless the region reduces rows or an output has an element per
  // row or one in all.
  bool split_rows = true, split_cols = true;
  // The generated function's body (see EmitNativeSource).
  std::string source;
};

// The regions of `ir`'s ops, in op order, none overlapping; each has at
// least two computing ops, or one reduction. `groups` are the interpreter's
// fusion groups ([first, last] op ranges, in order): a region holds each
// group whole or not at all, so either may run in place of the other.
std::vector<FusedRegion> PlanFusedRegions(
    const FunctionIr& ir, absl::Span<const std::pair<int32_t, int32_t>> groups);

// A translation unit defining `void pw_region_<k>(const PwNativeArgs*)` (C
// linkage) for each region k, and pw_native_abi(); it starts with
// kernels/scalar_ops.h and native_abi.h. The caller appends
// pw_native_source_hash().
std::string EmitNativeSource(absl::Span<const FusedRegion> regions);

// kernels/scalar_ops.h and native_abi.h, as compiled into the runtime.
const char* NativePrelude();

}  // namespace pw::codegen

#endif  // PATHWAYS_CODEGEN_FUSED_REGION_H_
