#ifndef PATHWAYS_KERNELS_DATA_MOVEMENT_H_
#define PATHWAYS_KERNELS_DATA_MOVEMENT_H_

// Data movement within a shard: the shape ops of the function IR (copy,
// reshape, broadcast_to, transpose, slice, rev, pad, concatenate, and the
// per-shard-pair blocks of all_to_all) all compile to strided copies, and
// take to a gather of rows. Plans are built by Compile; running them does no
// allocation and does not depend on the element type, only its size.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "csrc/function_ir/function_ir.h"

namespace pw {

// Copies, for every index i of `dims` (row-major), the element at
// src + src_offset + <i, src_strides> to dst + dst_offset + <i, dst_strides>
// (offsets and strides in elements; strides may be zero or negative).
struct CopyPlan {
  Dims dims;
  Dims src_strides;
  Dims dst_strides;
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
  int32_t operand = 0;  // which operand of the op is the source
  // all_to_all only: added to src_offset per destination shard, and to
  // dst_offset per source shard.
  int64_t src_shard_step = 0;
  int64_t dst_shard_step = 0;
};

// Deepest CopyPlan after merging contiguous dimensions.
inline constexpr int kMaxCopyRank = 16;

// The plans of op `v` of `ir`, a kCopy, kReshape, kBroadcastTo, kTranspose,
// kSlice, kRev, kPad, kConcatenate or kAllToAll (whose plan moves one chunk,
// for `num_shards` = ir.axis_size()). Dimensions are merged where both sides
// are contiguous, so a reshape is a single run. Unimplemented if a plan is
// deeper than kMaxCopyRank after merging.
absl::StatusOr<std::vector<CopyPlan>> MakeCopyPlans(const FunctionIr& ir, int32_t v);

// Runs one plan on elements of `elem_size` bytes (1, 2, 4 or 8).
void StridedCopy(const CopyPlan& plan, int64_t elem_size, const void* src, void* dst);

// take along an axis of one shard: x is [outer, dim, inner], the result
// [outer, num_indices, inner]; indices are clipped to [0, dim). `index_stride`
// is 0 for a single (scalar) index, 1 otherwise.
void TakeRows(int64_t elem_size, int64_t outer, int64_t dim, int64_t inner, const void* x,
              const int32_t* indices, int64_t num_indices, int64_t index_stride, void* out);

// Ops run by copy plans: the data-movement class of the op registry, and
// all_to_all, whose chunks between shards are copy plans too.
inline bool IsDataMovementKind(OpKind kind) {
  return GetOpClass(kind) == OpClass::kDataMovement || kind == OpKind::kAllToAll;
}

// kScatter for one shard, elements of `dtype`: out [outer, dim, inner] is
// `operand` (of out's shape, or one element filling it when
// `scalar_operand`), then each row j of updates [outer, num_indices, inner]
// is combined in at index indices[j * index_stride] by `combiner` (set
// replaces: the last update wins; add, mul, max, min accumulate in index
// order). Indices outside [0, dim) are skipped. The builder refuses add and
// mul into bool.
void ScatterRows(Combiner combiner, DType dtype, int64_t outer, int64_t dim, int64_t inner,
                 const void* operand, bool scalar_operand, const void* updates,
                 const int32_t* indices, int64_t num_indices, int64_t index_stride, void* out);

// Clips index `i` into [0, dim) (dim >= 1).
inline int64_t ClipIndex(int32_t i, int64_t dim) {
  return i < 0 ? 0 : (i >= dim ? dim - 1 : static_cast<int64_t>(i));
}

}  // namespace pw

#endif  // PATHWAYS_KERNELS_DATA_MOVEMENT_H_
