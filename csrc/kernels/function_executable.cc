#include "csrc/kernels/function_executable.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/parallel_for.h"
#include "csrc/base/status_macros.h"
#include "csrc/codegen/fused_region.h"
#include "csrc/kernels/collectives.h"
#include "csrc/kernels/cumulative.h"
#include "csrc/kernels/elementwise.h"
#include "csrc/kernels/linalg.h"
#include "csrc/kernels/matmul.h"
#include "csrc/kernels/reduction.h"
#include "csrc/kernels/sort.h"
#include "csrc/kernels/top_k.h"
#include "csrc/kernels/vector_math.h"


// The interpreter: LocalShards, and Run()/RunLocal(), which run a compiled
// function's ops in order over the shards of a gang.

namespace pw {
namespace {

using kernels::DimProduct;
using kernels::HostReduction;
using kernels::IsCrossShardKind;
using kernels::IsElementwiseKind;
using kernels::LiteralData;
using kernels::RoundUp;
using kernels::View;

template <typename T>
using ArrayFn = void (*)(const T*, T*, int64_t);

// The vector math generated code calls (codegen/native_abi.h).
const codegen::PwVectorMath kVectorMath = {
    ArrayFn<float>(&Exp),   ArrayFn<double>(&Exp),  ArrayFn<float>(&Log),   ArrayFn<double>(&Log),
    ArrayFn<float>(&Tanh),  ArrayFn<double>(&Tanh), ArrayFn<float>(&Sin),   ArrayFn<double>(&Sin),
    ArrayFn<float>(&Cos),   ArrayFn<double>(&Cos),  ArrayFn<float>(&Sqrt),  ArrayFn<double>(&Sqrt),
    ArrayFn<float>(&Rsqrt), ArrayFn<double>(&Rsqrt), ArrayFn<float>(&Erf),  ArrayFn<double>(&Erf),
    ArrayFn<float>(&Erfc),  ArrayFn<double>(&Erfc),
};

// A native region's loop space is cut into blocks for the executor's threads
// (base/parallel_for.h) when it has at least kMinSplitElements elements
// (tens of microseconds of work); into at most kBlocksPerThread per thread,
// each of at least kMinBlockElements. Column blocks are whole chunks of the
// generated loop (256 columns).
constexpr int64_t kMinSplitElements = int64_t{1} << 16;
constexpr int64_t kMinBlockElements = int64_t{1} << 14;
constexpr int64_t kBlocksPerThread = 3;
constexpr int64_t kColumnChunk = 256;

// Calls `fn` over the whole loop space of a region (num_shards x rows rows
// of cols columns), in blocks on the executor's threads if it pays.
void RunNativeRegion(codegen::PwRegionFn fn, int64_t rows_per_shard, int64_t cols, bool split_rows,
                     bool split_cols, int num_shards, const void* const* in, const int64_t* in_stride,
                     void* const* out, const int64_t* out_stride) {
  const int64_t rows = rows_per_shard * num_shards;
  const codegen::PwNativeArgs whole{0, rows, 0, cols, in, in_stride, out, out_stride, &kVectorMath};
  const int64_t elements = rows * cols;
  const int64_t blocks =
      elements < kMinSplitElements
          ? 1
          : ParallelPieces(static_cast<double>(elements), static_cast<double>(kMinBlockElements), kBlocksPerThread);
  if (blocks < 2) {
    fn(&whole);
    return;
  }
  auto by_rows = [&](int64_t pieces) {
    ParallelFor(pieces, [&](int64_t b) {
      codegen::PwNativeArgs part = whole;
      part.row_begin = rows * b / pieces;
      part.row_end = rows * (b + 1) / pieces;
      fn(&part);
    });
  };
  if (split_rows && rows >= blocks) return by_rows(blocks);
  if (split_cols) {
    // Blocks of whole chunks of columns, each over every row (so an output
    // with an element per column is written by one block per column).
    const int64_t width = std::max<int64_t>(
        kColumnChunk, ((cols + blocks - 1) / blocks + kColumnChunk - 1) / kColumnChunk * kColumnChunk);
    const int64_t col_blocks = (cols + width - 1) / width;
    if (col_blocks >= 2) {
      ParallelFor(col_blocks, [&](int64_t b) {
        codegen::PwNativeArgs part = whole;
        part.col_begin = b * width;
        part.col_end = std::min(cols, part.col_begin + width);
        fn(&part);
      });
      return;
    }
  }
  if (split_rows && rows >= 2) return by_rows(rows);
  fn(&whole);
}


}  // namespace

absl::StatusOr<LocalShards> LocalShards::Create(int gang_size, std::vector<int> positions) {
  if (gang_size < 1 || gang_size > kMaxAxisSize) {
    return absl::InvalidArgumentError(absl::StrCat("local shards: gang size ", gang_size,
                                                   " is not in [1, ", kMaxAxisSize, "]"));
  }
  if (positions.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local shards: no positions of the gang of ", gang_size));
  }
  for (size_t k = 0; k < positions.size(); ++k) {
    if (positions[k] < 0 || positions[k] >= gang_size) {
      return absl::InvalidArgumentError(absl::StrCat("local shards: position ", positions[k],
                                                     " is out of range for a gang of ", gang_size));
    }
    if (k > 0 && positions[k] <= positions[k - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("local shards: positions must be increasing, got ", positions[k],
                       " after ", positions[k - 1]));
    }
  }
  return LocalShards(gang_size, std::move(positions));
}

void FunctionExecutable::Run(int num_shards, absl::Span<const void* const> inputs,
                             absl::Span<void* const> outputs, void* scratch) const {
  // With no LocalShards every shard is here and nothing can fail.
  const ShardRange all{num_shards, 0, num_shards, 0, static_cast<int32_t>(ir_->ops().size())};
  RunShards(all, nullptr, nullptr, inputs, outputs, scratch,
            static_cast<uint8_t*>(scratch) + scratch_per_shard_ * num_shards, nullptr)
      .IgnoreError();
}

void FunctionExecutable::RunStage(int stage, int num_shards, int begin, int end,
                                  absl::Span<const void* const> inputs,
                                  absl::Span<void* const> outputs, void* scratch,
                                  void* tiles) const {
  const Stage& st = stages_[static_cast<size_t>(stage)];
  // One shard at a time, each in its own region of the scratch.
  for (int s = begin; s < end; ++s) {
    RunShards({num_shards, s, s + 1, st.begin, st.end, true, true}, nullptr, nullptr, inputs,
              outputs, scratch, tiles, nullptr)
        .IgnoreError();  // no LocalShards: nothing can fail
  }
}

void FunctionExecutable::RunStageCollective(int stage, int num_shards,
                                            absl::Span<const void* const> inputs,
                                            void* scratch) const {
  const Stage& st = stages_[static_cast<size_t>(stage)];
  if (st.collective < 0) return;
  const absl::Span<const Op> ops = ir_->ops();
  const Op& op = ops[st.collective];
  uint8_t* const base = static_cast<uint8_t*>(scratch);
  const int64_t out_offset = scratch_offset_[st.collective];
  if (loop_index_[st.collective] >= 0) {
    // A loop whose body or cond reads other shards, over the whole gang:
    // its operands and results are in the shards' regions,
    // scratch_per_shard_ apart; its workspace, then the tiles, after them.
    const LoopPlan& sp = loop_plans_[static_cast<size_t>(loop_index_[st.collective])];
    uint8_t* const workspace = base + scratch_per_shard_ * num_shards;
    auto operand = [&](int k) -> Strided {
      const Op& in = ops[op.operands[k]];
      if (in.kind == OpKind::kParameter) {
        return {static_cast<const uint8_t*>(inputs[in.param_index]), in.type.num_bytes()};
      }
      if (in.kind == OpKind::kConstant) return {static_cast<const uint8_t*>(LiteralData(in)), 0};
      return {base + scratch_offset_[op.operands[k]], scratch_per_shard_};
    };
    auto result = [&](int j) -> Strided {
      return {base + out_offset + sp.elements[static_cast<size_t>(j)], scratch_per_shard_};
    };
    RunLoop(st.collective, num_shards, operand, result, workspace,
            workspace + sp.workspace_bytes * num_shards, nullptr, nullptr, nullptr)
        .IgnoreError();  // no LocalShards: nothing can fail
    return;
  }
  if (op.kind == OpKind::kAxisIndex) {
    for (int s = 0; s < num_shards; ++s) {
      const int32_t position = s;
      std::memcpy(base + s * scratch_per_shard_ + out_offset, &position, sizeof(position));
    }
    return;
  }
  // The operand over the whole gang: its shards are scratch_per_shard_
  // apart (a multiple of 64 bytes, so of the element size).
  const Op& in = ops[op.operands[0]];
  const int64_t elem_stride = in.type.dims.empty() ? 0 : 1;
  View x;
  if (in.kind == OpKind::kParameter) {
    x = {inputs[in.param_index], in.type.num_elements(), elem_stride};
  } else if (in.kind == OpKind::kConstant) {
    x = {LiteralData(in), 0, elem_stride};
  } else {
    x = {base + scratch_offset_[op.operands[0]],
         scratch_per_shard_ / DTypeSize(in.type.dtype), elem_stride};
  }
  // The result, gang-contiguous as the kernels write it, after the shards'
  // regions; then each shard's row into its region.
  uint8_t* const gang_out = base + scratch_per_shard_ * num_shards;
  const auto [first, count] = copy_range_[static_cast<size_t>(st.collective)];
  kernels::RunCrossShardKernel(op, in.type.dims, count > 0 ? &copy_plans_[first] : nullptr,
                               num_shards, x, gang_out);
  const int64_t bytes = op.type.num_bytes();
  if (bytes == 0) return;
  for (int s = 0; s < num_shards; ++s) {
    std::memcpy(base + s * scratch_per_shard_ + out_offset, gang_out + s * bytes, bytes);
  }
}

void* FunctionExecutable::AcquireSharedScratch(int64_t bytes) const {
  {
    MutexLock lock(&pool_mu_);
    for (size_t i = 0; i < free_scratch_.size(); ++i) {
      if (free_scratch_[i].bytes == bytes) {
        void* data = free_scratch_[i].data;
        free_scratch_.erase(free_scratch_.begin() + static_cast<std::ptrdiff_t>(i));
        return data;
      }
    }
  }
  return ::operator new(static_cast<size_t>(std::max<int64_t>(bytes, 1)), std::align_val_t{64}, std::nothrow);
}

void FunctionExecutable::ReleaseSharedScratch(void* scratch, int64_t bytes) const {
  // Keep a few blocks: as many as gangs of this function run at once, in
  // practice the executor's threads.
  constexpr size_t kMaxFree = 4;
  {
    MutexLock lock(&pool_mu_);
    if (free_scratch_.size() < kMaxFree) {
      free_scratch_.push_back({bytes, scratch});
      return;
    }
  }
  ::operator delete(scratch, std::align_val_t{64});
}

FunctionExecutable::~FunctionExecutable() {
  MutexLock lock(&pool_mu_);
  for (const ScratchBlock& b : free_scratch_) ::operator delete(b.data, std::align_val_t{64});
}

absl::Status FunctionExecutable::RunLocal(const LocalShards& local,
                                          absl::Span<const void* const> inputs,
                                          absl::Span<void* const> outputs, void* scratch,
                                          GangCollectives* collectives) const {
  if (ir_->axis_size() > 0 && ir_->axis_size() != local.gang_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("run: @", ir_->name(), " was traced for ", ir_->axis_size(),
                     " shards, got a gang of ", local.gang_size()));
  }
  if (collectives == nullptr && first_collective_.kind != CollectiveCall::Kind::kNone &&
      !local.whole_gang()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run: @", ir_->name(), " needs collectives over the gang, which has ", local.gang_size(),
        " shards of which ", local.num_local(), " are local, and no collectives were given"));
  }
  const int n = local.num_local();
  const ShardRange all{n, 0, n, 0, static_cast<int32_t>(ir_->ops().size())};
  uint8_t* const tiles = static_cast<uint8_t*>(scratch) + scratch_per_shard_ * n;
  return RunShards(all, &local, collectives, inputs, outputs, scratch, tiles, tiles + tile_bytes_);
}

absl::Status FunctionExecutable::RunShards(const ShardRange& range, const LocalShards* local,
                                           GangCollectives* collectives,
                                           absl::Span<const void* const> inputs,
                                           absl::Span<void* const> outputs, void* scratch,
                                           void* tile_buffer, uint8_t* gang_temp) const {
  const absl::Span<const Op> ops = ir_->ops();
  uint8_t* const base = static_cast<uint8_t*>(scratch);
  // Kernels see the range's shards as a gang of their own: every value's
  // shards are contiguous, so its range starts `s0` shards in.
  const int total = range.num_shards;
  const int num_shards = range.end - range.begin;
  const int64_t s0 = range.begin;
  // Shard-major: this one shard's values start here (see ShardRange).
  uint8_t* const region = base + s0 * scratch_per_shard_;

  auto view = [&](int32_t v) -> View {
    const Op& op = ops[v];
    const int64_t n = op.type.num_elements();
    const int64_t first = s0 == 0 ? 0 : s0 * n * DTypeSize(op.type.dtype);
    const int64_t elem_stride = op.type.dims.empty() ? 0 : 1;
    switch (op.kind) {
      case OpKind::kParameter:
        return {static_cast<const uint8_t*>(inputs[op.param_index]) + first, n, elem_stride};
      case OpKind::kConstant:
        return {LiteralData(op), 0, elem_stride};
      default:
        if (range.shard_major) return {region + scratch_offset_[v], n, elem_stride};
        return {base + scratch_offset_[v] * total + first, n, elem_stride};
    }
  };
  auto result = [&](int32_t v) -> uint8_t* {
    if (range.shard_major) return region + scratch_offset_[v];
    if (s0 == 0) return base + scratch_offset_[v] * total;
    const Op& op = ops[v];
    return base + scratch_offset_[v] * total + s0 * op.type.num_elements() * DTypeSize(op.type.dtype);
  };

  uint8_t* const tiles = static_cast<uint8_t*>(tile_buffer);
  uint64_t written_directly = 0;  // function outputs a native region wrote in place (bit i: output i)
  for (size_t i = static_cast<size_t>(range.op_begin); i < static_cast<size_t>(range.op_end); ++i) {
    const Op& op = ops[i];
    if (native_start_[i] >= 0) {  // a native region: one call, once its code is loaded
      const int32_t k = native_start_[i];
      const NativeRegion& nr = native_regions_[static_cast<size_t>(k)];
      const codegen::PwRegionFn* fns = native_->regions.load(std::memory_order_acquire);
      if (fns == nullptr) {
        if (k == 0) native_->runs.fetch_add(1, std::memory_order_relaxed);
      } else if (nr.last < range.op_end) {
        const void* in[codegen::kMaxRegionIo];
        int64_t in_stride[codegen::kMaxRegionIo];
        void* out[codegen::kMaxRegionIo];
        int64_t out_stride[codegen::kMaxRegionIo];
        for (size_t j = 0; j < nr.inputs.size(); ++j) {
          const View x = view(nr.inputs[j]);
          in[j] = x.data;
          in_stride[j] = x.shard_stride;
        }
        // A function output nothing after the region reads goes straight to
        // the caller's buffer when this range writes the outputs.
        const bool writes_outputs =
            range.write_outputs && range.op_end == static_cast<int32_t>(ops.size());
        for (size_t j = 0; j < nr.outputs.size(); ++j) {
          const Op& o = ops[nr.outputs[j]];
          out_stride[j] = o.type.num_elements();
          if (writes_outputs && nr.direct[j] >= 0) {
            out[j] = static_cast<uint8_t*>(outputs[nr.direct[j]]) + s0 * o.type.num_bytes();
            written_directly |= uint64_t{1} << nr.direct[j];
          } else {
            out[j] = result(nr.outputs[j]);
          }
        }
        RunNativeRegion(fns[k], nr.rows, nr.cols, nr.split_rows, nr.split_cols, num_shards, in,
                        in_stride, out, out_stride);
        i = static_cast<size_t>(nr.last);
        continue;
      }
    }
    if (op.kind == OpKind::kParameter || op.kind == OpKind::kConstant || skip_[i]) continue;
    if (group_start_[i] >= 0) {  // a fused run, tile by tile over the whole gang
      const FusionGroup& g = groups_[static_cast<size_t>(group_start_[i])];
      const int64_t count = op.type.num_elements() * num_shards;
      for (int64_t t0 = 0; t0 < count; t0 += kTileElements) {
        const int64_t len = std::min(kTileElements, count - t0);
        auto tile_view = [&](int32_t u) -> View {
          const Op& uo = ops[u];
          if (tile_offset_[u] >= 0) return {tiles + tile_offset_[u], len, 1};
          if (uo.kind == OpKind::kConstant) return {LiteralData(uo), 0, 0};
          return {static_cast<const uint8_t*>(view(u).data) + t0 * DTypeSize(uo.type.dtype),
                  len, 1};
        };
        for (int32_t v = g.first; v <= g.last; ++v) {
          const Op& fop = ops[v];
          if (fop.kind == OpKind::kParameter || fop.kind == OpKind::kConstant) continue;
          const View x = tile_view(fop.operands[0]);
          const View y = fop.operands.size() > 1 ? tile_view(fop.operands[1]) : x;
          const View z = fop.operands.size() > 2 ? tile_view(fop.operands[2]) : x;
          void* o = tile_offset_[v] >= 0
                        ? static_cast<void*>(tiles + tile_offset_[v])
                        : static_cast<void*>(result(v) + t0 * DTypeSize(fop.type.dtype));
          kernels::RunElementwise(fop, ops[fop.operands[0]].type.dtype, 1, len, x, y, z, o, nullptr);
        }
      }
      i = static_cast<size_t>(g.last);
      continue;
    }
    void* out = result(static_cast<int32_t>(i));
    const int64_t n = op.type.num_elements();
    if (loop_index_[i] >= 0) {
      const LoopPlan& sp = loop_plans_[static_cast<size_t>(loop_index_[i])];
      // Value-major runs start at shard 0 (only shard-major ones run a part).
      const int64_t scale = range.shard_major ? 1 : total;
      uint8_t* const workspace =
          (range.shard_major ? region : base) + sp.workspace * scale;
      auto operand = [&](int k) -> Strided {
        const int32_t u = op.operands[static_cast<size_t>(k)];
        const View x = view(u);
        return {static_cast<const uint8_t*>(x.data),
                x.shard_stride * DTypeSize(ops[u].type.dtype)};
      };
      auto element = [&](int j) -> Strided {
        const ValueType& t = op.type.elements[static_cast<size_t>(j)];
        return {static_cast<const uint8_t*>(out) + sp.elements[static_cast<size_t>(j)] * scale,
                t.num_bytes()};
      };
      PW_RETURN_IF_ERROR(RunLoop(static_cast<int32_t>(i), num_shards, operand, element, workspace,
                                 tile_buffer, gang_temp, local, collectives));
      continue;
    }
    if (op.kind == OpKind::kAxisIndex) {
      int32_t* o = static_cast<int32_t*>(out);
      if (local == nullptr) {
        for (int s = 0; s < num_shards; ++s) o[s] = static_cast<int32_t>(s0 + s);
      } else {
        for (int s = 0; s < num_shards; ++s) o[s] = local->positions()[s];
      }
      continue;
    }
    const View x = view(op.operands[0]);
    if (IsCrossShardKind(op.kind)) {
      auto run_cross_shard = [&](int shards, const View& in, void* result) {
        const auto [first, count] = copy_range_[i];
        kernels::RunCrossShardKernel(op, ops[op.operands[0]].type.dims,
                            count > 0 ? &copy_plans_[first] : nullptr, shards, in, result);
      };
      if (local == nullptr || local->whole_gang()) {
        run_cross_shard(num_shards, x, out);
        continue;
      }
      const int gang = local->gang_size();
      const int64_t in_bytes = ops[op.operands[0]].type.num_bytes();
      if (const std::optional<ReduceOp> reduce = HostReduction(op.kind, op.type.dtype);
          reduce.has_value() && x.shard_stride != 0 && n > 0) {
        // Only some shards are here, and the op is a reduction: reduce the
        // local shards into this host's first row, that row across hosts,
        // then copy it to the other local rows.
        if (op.kind == OpKind::kPmean) {
          double* sums = reinterpret_cast<double*>(gang_temp);  // 8n bytes fit (see Compile)
          kernels::LocalMeanSums(op.type.dtype, num_shards, n, x, sums);
          PW_RETURN_IF_ERROR(collectives->AllReduce(DType::kF64, ReduceOp::kSum, sums, n));
          kernels::MeanFromSums(op.type.dtype, gang, n, sums, out);
        } else {
          kernels::RunCrossShardKernel(op, ops[op.operands[0]].type.dims, nullptr, num_shards, x, out);
          PW_RETURN_IF_ERROR(collectives->AllReduce(op.type.dtype, *reduce, out, n));
        }
        const int64_t out_bytes = op.type.num_bytes();
        for (int s = 1; s < num_shards; ++s) {
          std::memcpy(static_cast<uint8_t*>(out) + s * out_bytes, out, out_bytes);
        }
        continue;
      }
      // Only some shards are here: gather the operand over the gang, run the
      // kernel over the whole gang (same order of operations as Run() over
      // it, so the same bits), keep the local rows.
      View full = x;  // a constant (shard_stride 0) is already every shard's value
      if (x.shard_stride != 0 && in_bytes > 0) {
        PW_RETURN_IF_ERROR(collectives->AllGather(x.data, gang_temp, in_bytes));
        full.data = gang_temp;
      }
      const int64_t gathered_bytes = x.shard_stride != 0 ? RoundUp(in_bytes) : 0;
      uint8_t* const gang_out = gang_temp + gathered_bytes * gang;
      run_cross_shard(gang, full, gang_out);
      const int64_t out_bytes = op.type.num_bytes();
      if (out_bytes == 0) continue;
      for (int s = 0; s < num_shards; ++s) {
        std::memcpy(static_cast<uint8_t*>(out) + s * out_bytes,
                    gang_out + int64_t{local->positions()[s]} * out_bytes, out_bytes);
      }
      continue;
    }
    const BroadcastPlan* plan =
        plan_index_[i] >= 0 ? &plans_[static_cast<size_t>(plan_index_[i])] : nullptr;
    const DType in_dtype = ops[op.operands[0]].type.dtype;
    if (IsElementwiseKind(op.kind)) {
      const View y = op.operands.size() > 1 ? view(op.operands[1]) : x;
      const View z = op.operands.size() > 2 ? view(op.operands[2]) : x;
      kernels::RunElementwise(op, in_dtype, num_shards, n, x, y, z, out, plan);
    } else if (IsDataMovementKind(op.kind)) {
      const int64_t esize = DTypeSize(op.type.dtype);
      const auto [first, count] = copy_range_[i];
      uint8_t* o = static_cast<uint8_t*>(out);
      if (op.kind == OpKind::kPad) std::memset(o, 0, op.type.num_bytes() * num_shards);
      for (int32_t j = first; j < first + count; ++j) {
        const CopyPlan& p = copy_plans_[j];
        const View src = view(op.operands[p.operand]);
        for (int s = 0; s < num_shards; ++s) {
          StridedCopy(p, esize, static_cast<const uint8_t*>(src.data) + s * src.shard_stride * esize,
                      o + s * n * esize);
        }
      }
    } else if (op.kind == OpKind::kTake || op.kind == OpKind::kScatter) {
      // x (take) or the result (scatter) is [outer, dim, inner] around op.axis.
      const bool take = op.kind == OpKind::kTake;
      const View idx = view(op.operands[1]);
      const Dims& full = take ? ops[op.operands[0]].type.dims : op.type.dims;
      const size_t a = static_cast<size_t>(op.axis);
      const int64_t outer = DimProduct(full, 0, a);
      const int64_t dim = full[a];
      const int64_t inner = DimProduct(full, a + 1, full.size());
      const int64_t num_indices = ops[op.operands[1]].type.num_elements();
      const int64_t index_stride = idx.elem_stride;
      const int64_t esize = DTypeSize(op.type.dtype);
      const View updates = take ? x : view(op.operands[2]);
      const bool scalar_operand = ops[op.operands[0]].type.dims.empty();
      for (int s = 0; s < num_shards; ++s) {
        const int32_t* is = static_cast<const int32_t*>(idx.data) + s * idx.shard_stride;
        const uint8_t* xs = static_cast<const uint8_t*>(x.data) + s * x.shard_stride * esize;
        uint8_t* os = static_cast<uint8_t*>(out) + s * n * esize;
        if (take) {
          TakeRows(esize, outer, dim, inner, xs, is, num_indices, index_stride, os);
          continue;
        }
        ScatterRows(op.combiner, op.type.dtype, outer, dim, inner, xs, scalar_operand,
                    static_cast<const uint8_t*>(updates.data) + s * updates.shard_stride * esize,
                    is, num_indices, index_stride, os);
      }
    } else if (op.kind == OpKind::kTopK) {
      // Rows of the operand's last dimension; its k positions per row.
      const Dims& in = ops[op.operands[0]].type.dims;
      const int64_t rows = DimProduct(in, 0, in.size() - 1);
      const int64_t esize = DTypeSize(in_dtype);
      for (int s = 0; s < num_shards; ++s) {
        kernels::TopKRows(in_dtype, rows, in.back(), op.type.dims.back(),
                          static_cast<const uint8_t*>(x.data) + s * x.shard_stride * esize,
                          static_cast<int32_t*>(out) + s * n);
      }
    } else if (op.kind == OpKind::kSort) {
      const Dims& in = ops[op.operands[0]].type.dims;
      const int64_t row = in.back();
      const int64_t esize = DTypeSize(in_dtype);
      for (int s = 0; s < num_shards; ++s) {
        kernels::SortRows(in_dtype, row == 0 ? 0 : n / row, row, op.reverse,
                          static_cast<const uint8_t*>(x.data) + s * x.shard_stride * esize,
                          static_cast<int32_t*>(out) + s * n);
      }
    } else if (GetOpClass(op.kind) == OpClass::kLinalg) {
      const LinalgPlan& lp = linalg_plans_[static_cast<size_t>(linalg_index_[i])];
      // Value-major runs start at shard 0 (only shard-major ones run a part).
      const int64_t scale = range.shard_major ? 1 : total;
      uint8_t* const workspace = (range.shard_major ? region : base) + lp.workspace * scale;
      const DType dtype = ops[op.operands[0]].type.dtype;
      const int64_t esize = DTypeSize(dtype);
      const uint8_t* const in = static_cast<const uint8_t*>(x.data);
      if (op.kind == OpKind::kCholesky) {
        for (int s = 0; s < num_shards; ++s) {
          kernels::CholeskyMatrices(dtype, lp.batch, lp.n, in + s * x.shard_stride * esize,
                                    static_cast<uint8_t*>(out) + s * n * esize);
        }
        continue;
      }
      if (op.kind == OpKind::kTriangularSolve) {
        const View b = view(op.operands[1]);
        for (int s = 0; s < num_shards; ++s) {
          kernels::TriangularSolveMatrices(
              dtype, lp.batch, lp.m, lp.n, op.lower, op.unit_diagonal, op.transpose_a,
              in + s * x.shard_stride * esize,
              static_cast<const uint8_t*>(b.data) + s * b.shard_stride * esize,
              static_cast<uint8_t*>(out) + s * n * esize);
        }
        continue;
      }
      // A tuple: element j of shard s at its piece, then s of its size in.
      uint8_t* element[3] = {nullptr, nullptr, nullptr};
      int64_t element_bytes[3] = {0, 0, 0};
      for (size_t j = 0; j < op.type.elements.size(); ++j) {
        element[j] = static_cast<uint8_t*>(out) + lp.elements[j] * scale;
        element_bytes[j] = op.type.elements[j].num_bytes();
      }
      for (int s = 0; s < num_shards; ++s) {
        const uint8_t* xs = in + s * x.shard_stride * esize;
        uint8_t* e0 = element[0] + s * element_bytes[0];
        uint8_t* e1 = element[1] + s * element_bytes[1];
        uint8_t* e2 = element[2] + s * element_bytes[2];
        if (op.kind == OpKind::kSvd) {
          kernels::SvdMatrices(dtype, lp.batch, lp.m, lp.n, op.full_matrices, xs, e0, e1, e2,
                               workspace, lp.workspace_bytes);
        } else if (op.kind == OpKind::kQr) {
          kernels::QrMatrices(dtype, lp.batch, lp.m, lp.n, op.full_matrices, xs, e0, e1, workspace,
                              lp.workspace_bytes);
        } else if (op.kind == OpKind::kEigh) {
          kernels::EighMatrices(dtype, lp.batch, lp.n, xs, e0, e1, workspace, lp.workspace_bytes);
        } else {
          kernels::LuMatrices(dtype, lp.batch, lp.n, xs, e0, reinterpret_cast<int32_t*>(e1),
                              reinterpret_cast<int32_t*>(e2), workspace);
        }
      }
    } else if (op.kind == OpKind::kCumulative) {
      const Dims& dims = op.type.dims;
      const size_t a = static_cast<size_t>(op.axis);
      const int64_t esize = DTypeSize(op.type.dtype);
      for (int s = 0; s < num_shards; ++s) {
        kernels::CumulativeRows(op.combiner, op.type.dtype, DimProduct(dims, 0, a), dims[a],
                                DimProduct(dims, a + 1, dims.size()), op.reverse,
                                static_cast<const uint8_t*>(x.data) + s * x.shard_stride * esize,
                                static_cast<uint8_t*>(out) + s * n * esize);
      }
    } else if (op.kind == OpKind::kMatmul) {
      const MatmulPlan& mp = matmul_plans_[static_cast<size_t>(matmul_index_[i])];
      const View a = view(mp.a);
      const View y = view(mp.b);
      const int64_t esize = DTypeSize(op.type.dtype);
      const int64_t batch = static_cast<int64_t>(mp.a_offsets.size());
      for (int s = 0; s < num_shards; ++s) {
        BatchedMatmul(op.type.dtype, mp.trans_a, mp.trans_b, mp.m, mp.n, mp.k, batch,
                      static_cast<const uint8_t*>(a.data) + s * a.shard_stride * esize,
                      mp.a_offsets.data(),
                      static_cast<const uint8_t*>(y.data) + s * y.shard_stride * esize,
                      mp.b_offsets.data(), static_cast<uint8_t*>(out) + s * n * esize);
      }
    } else if (op.kind == OpKind::kReduce) {
      const ReducePlan& rp = reduce_plans_[static_cast<size_t>(reduce_index_[i])];
      kernels::RunReduce(op.reduce_kind, in_dtype, num_shards, n, x, rp, out);
    }
  }

  if (range.op_end < static_cast<int32_t>(ops.size()) || !range.write_outputs) {
    return absl::OkStatus();
  }
  // The outputs, after the last op: the range's shards of each.
  for (int i = 0; i < ir_->num_outputs(); ++i) {
    const int32_t v = ir_->outputs()[i];
    const View src = view(v);
    const int64_t bytes = ops[v].type.num_bytes();
    if (bytes == 0 || (i < 64 && (written_directly >> i) & 1)) continue;
    uint8_t* dst = static_cast<uint8_t*>(outputs[i]) + s0 * bytes;
    if (src.shard_stride != 0) {
      std::memcpy(dst, src.data, bytes * num_shards);
    } else {  // a constant: every shard gets the literal
      for (int s = 0; s < num_shards; ++s) std::memcpy(dst + s * bytes, src.data, bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status FunctionExecutable::RunLoop(int32_t v, int num_shards,
                                         absl::FunctionRef<Strided(int)> operand,
                                         absl::FunctionRef<Strided(int)> result,
                                         uint8_t* workspace, void* tiles, uint8_t* gang_temp,
                                         const LocalShards* local,
                                         GangCollectives* collectives) const {
  const Op& op = ir_->ops()[v];
  const LoopPlan& sp = loop_plans_[static_cast<size_t>(loop_index_[v])];
  const FunctionExecutable& body = *sp.body;
  const FunctionExecutable* const cond = sp.cond.get();  // a while's
  const FunctionIr& f = body.ir();
  const int n = num_shards;
  const int nc = op.num_carries;
  const int nx = op.num_xs;
  const int num_params = f.num_params();
  const int num_outputs = f.num_outputs();
  auto at = [&](int64_t offset) { return workspace + offset * n; };
  // The input pointers (the body's and the cond's: the same parameters),
  // the body's output pointers and the cond's, rewritten each iteration.
  const void** const ins = reinterpret_cast<const void**>(at(sp.pointers));
  void** const outs = const_cast<void**>(ins) + num_params;
  void** const cond_out = outs + num_outputs;
  // Shard s of `src` to dst + s * bytes.
  auto gather = [&](const Strided& src, int64_t bytes, uint8_t* dst) {
    if (bytes == 0) return;
    for (int s = 0; s < n; ++s) std::memcpy(dst + s * bytes, src.data + s * src.stride, bytes);
  };
  for (int k = nc + nx; k < num_params; ++k) {
    const Strided src = operand(k);
    const int64_t bytes = f.param_type(k).num_bytes();
    if (n == 1 || src.stride == bytes) {
      ins[k] = src.data;  // already as the body reads a parameter
    } else {
      uint8_t* copy = at(sp.consts[static_cast<size_t>(k - nc - nx)]);
      gather(src, bytes, copy);
      ins[k] = copy;
    }
  }
  const std::vector<int64_t>* cur = &sp.carry_a;
  const std::vector<int64_t>* next = &sp.carry_b;
  for (int j = 0; j < nc; ++j) gather(operand(j), f.param_type(j).num_bytes(), at((*cur)[j]));
  const ShardRange all{n, 0, n, 0, static_cast<int32_t>(f.ops().size())};
  uint8_t* const flags = cond != nullptr ? at(sp.flags) : nullptr;
  // A while's agreement with the gang's other hosts (see "Loops").
  const bool agree = sp.agree && local != nullptr && !local->whole_gang();
  for (int64_t it = 0;; ++it) {
    for (int j = 0; j < nc; ++j) ins[j] = at((*cur)[j]);
    if (cond == nullptr) {
      if (it == op.length) break;
    } else {
      // Each shard's cond; the loop goes on while any shard's is true.
      cond_out[0] = flags;
      const ShardRange cond_range{n, 0, n, 0, static_cast<int32_t>(cond->ir().ops().size())};
      PW_RETURN_IF_ERROR(cond->RunShards(
          cond_range, local, collectives, absl::MakeConstSpan(ins, static_cast<size_t>(num_params)),
          absl::MakeConstSpan(cond_out, 1), workspace, tiles, gang_temp));
      bool any = false;
      for (int s = 0; s < n; ++s) any = any || flags[s] != 0;
      if (agree) {
        bool gang_any = any;
        PW_RETURN_IF_ERROR(collectives->AllReduce(DType::kBool, ReduceOp::kMax, &gang_any, 1));
        any = gang_any;
      }
      if (!any) break;
    }
    const int64_t i = op.reverse ? op.length - 1 - it : it;
    for (int j = 0; j < nc; ++j) outs[j] = at((*next)[j]);
    for (int k = nc; k < nc + nx; ++k) {
      const Strided src = operand(k);
      const int64_t bytes = f.param_type(k).num_bytes();
      if (n == 1) {
        ins[k] = src.data + i * bytes;
        continue;
      }
      uint8_t* slice = at(sp.slices[static_cast<size_t>(k - nc)]);
      gather({src.data + i * bytes, src.stride}, bytes, slice);
      ins[k] = slice;
    }
    for (int j = nc; j < num_outputs; ++j) {
      const Strided r = result(j);
      outs[j] = n == 1 ? const_cast<uint8_t*>(r.data) + i * f.output_type(j).num_bytes()
                       : at(sp.ys[static_cast<size_t>(j - nc)]);
    }
    PW_RETURN_IF_ERROR(body.RunShards(all, local, collectives,
                                      absl::MakeConstSpan(ins, static_cast<size_t>(num_params)),
                                      absl::MakeConstSpan(outs, static_cast<size_t>(num_outputs)),
                                      workspace, tiles, gang_temp));
    if (n > 1) {
      for (int j = nc; j < num_outputs; ++j) {
        const Strided r = result(j);
        const int64_t bytes = f.output_type(j).num_bytes();
        if (bytes == 0) continue;
        const uint8_t* y = at(sp.ys[static_cast<size_t>(j - nc)]);
        uint8_t* dst = const_cast<uint8_t*>(r.data) + i * bytes;
        for (int s = 0; s < n; ++s) std::memcpy(dst + s * r.stride, y + s * bytes, bytes);
      }
    }
    if (cond != nullptr) {
      // A shard whose cond is false keeps its carries.
      for (int s = 0; s < n; ++s) {
        if (flags[s] != 0) continue;
        for (int j = 0; j < nc; ++j) {
          const int64_t bytes = f.param_type(j).num_bytes();
          std::memcpy(at((*next)[j]) + s * bytes, at((*cur)[j]) + s * bytes, bytes);
        }
      }
    }
    std::swap(cur, next);
  }
  for (int j = 0; j < nc; ++j) {
    const Strided r = result(j);
    const int64_t bytes = f.output_type(j).num_bytes();
    if (bytes == 0) continue;
    const uint8_t* c = at((*cur)[j]);
    for (int s = 0; s < n; ++s) std::memcpy(const_cast<uint8_t*>(r.data) + s * r.stride, c + s * bytes, bytes);
  }
  return absl::OkStatus();
}

}  // namespace pw

