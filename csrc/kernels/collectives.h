#ifndef PATHWAYS_KERNELS_COLLECTIVES_H_
#define PATHWAYS_KERNELS_COLLECTIVES_H_

// Kernels of the cross-shard ops (psum, pmean, pmax, pmin, all_gather,
// ppermute, all_to_all, psum_scatter) over the shards of a gang in memory,
// and the pieces RunLocal needs when only some shards are on this host.

#include <cstdint>
#include <optional>

#include "csrc/base/reduce_op.h"
#include "csrc/function_ir/function_ir.h"
#include "csrc/kernels/data_movement.h"
#include "csrc/kernels/kernel_util.h"

namespace pw::kernels {

// Ops whose result on one shard depends on other shards or on the shard's
// position in the gang. Every other op computes each shard from that shard's
// operands alone (nothing is random or position-based), so RunLocal runs
// them on the local shards as they are.
inline bool IsCrossShardKind(OpKind kind) { return IsCollectiveOp(kind); }

// How RunLocal reduces a cross-shard op's local results across hosts when
// the op is a reduction (psum, pmean, pmax, pmin), else nothing: the op
// gathers its operand instead. psum of bool is a logical or (see Psum).
std::optional<ReduceOp> HostReduction(OpKind kind, DType dtype);

// pmean on a partial gang, before and after the hosts' AllReduce: `sums`
// gets this host's float64 sums of its shards (in order) of `x` (of
// `dtype`); then `out` (one shard) gets the gang's sums divided by
// `gang_size`, as Run()'s pmean.
void LocalMeanSums(DType dtype, int num_shards, int64_t n, View x, double* sums);
void MeanFromSums(DType dtype, int gang_size, int64_t n, const double* sums, void* out);

// Runs cross-shard op `op` (not axis_index) over `num_shards` shards: the
// whole gang, whose operand is `x`. `in_dims` are the operand's dims;
// `all_to_all_plan` is the op's CopyPlan when it is an all_to_all.
void RunCrossShardKernel(const Op& op, const Dims& in_dims, const CopyPlan* all_to_all_plan,
                         int num_shards, const View& x, void* out);

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_COLLECTIVES_H_
