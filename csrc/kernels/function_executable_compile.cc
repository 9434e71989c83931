#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/status_macros.h"
#include "csrc/codegen/fused_region.h"
#include "csrc/codegen/native_compiler.h"
#include "csrc/kernels/collectives.h"
#include "csrc/kernels/elementwise.h"
#include "csrc/kernels/function_executable.h"
#include "csrc/kernels/linalg.h"

// FunctionExecutable::Compile: liveness, elementwise fusion, buffer
// assignment (scratch slots and tiles) and the per-op plans Run() reads.

namespace pw {
namespace {

using kernels::HostReduction;
using kernels::IsBinaryKind;
using kernels::IsComparisonKind;
using kernels::IsCrossShardKind;
using kernels::IsElementwiseKind;
using kernels::Offset;
using kernels::RoundUp;

// Whether Run() has a kernel for ops of `kind`: every op of the registry
// (each class has its kernels; elementwise ones switch over every kind of
// their rule), so only a value outside the enum has none.
bool HasKernel(OpKind kind) { return static_cast<int>(kind) < kNumOpKinds; }

// Bytes of a value's scratch slot (per shard): a tuple's holds each element
// in a 64-byte aligned piece.
int64_t SlotBytes(const ValueType& type) {
  if (!type.is_tuple()) return RoundUp(type.num_bytes());
  int64_t bytes = 0;
  for (const ValueType& e : type.elements) bytes += RoundUp(e.num_bytes());
  return bytes;
}

// Where element `index` of a tuple starts in the tuple's slot (per shard).
int64_t ElementOffset(const ValueType& tuple, int64_t index) {
  int64_t offset = 0;
  for (int64_t j = 0; j < index; ++j) {
    offset += RoundUp(tuple.elements[static_cast<size_t>(j)].num_bytes());
  }
  return offset;
}


}  // namespace

absl::StatusOr<std::shared_ptr<const FunctionExecutable>> FunctionExecutable::Compile(
    std::shared_ptr<const FunctionIr> ir, bool native) {
  if (ir == nullptr) return absl::InvalidArgumentError("compile: null function");
  const absl::Span<const Op> ops = ir->ops();
  const int32_t num_ops = static_cast<int32_t>(ops.size());

  for (int32_t i = 0; i < num_ops; ++i) {
    if (!HasKernel(ops[i].kind)) {
      return absl::UnimplementedError(
          absl::StrCat("compile: @", ir->name(), ": op %", i, " has kind ",
                       static_cast<int>(ops[i].kind), ", which the kernels cannot run"));
    }
  }
  for (int32_t i = 0; i < num_ops; ++i) {
    // The builder computes on bfloat16 in float32 (function_ir.h), so only
    // kernels that move elements ever see it; they are all that take it.
    const Op& op = ops[i];
    if (kernels::MovesBFloat16(op.kind)) continue;
    bool bf16 = op.type.dtype == DType::kBF16;
    for (int32_t u : op.operands) bf16 = bf16 || ops[u].type.dtype == DType::kBF16;
    if (bf16) {
      return absl::InternalError(absl::StrCat("compile: @", ir->name(), ": op %", i, " (",
                                              OpKindName(op.kind),
                                              ") computes on bfloat16, which has no kernel "
                                              "(FunctionBuilder computes it in float32)"));
    }
  }
  auto exe = std::shared_ptr<FunctionExecutable>(new FunctionExecutable(ir));

  // Loop bodies (and while conds), each compiled once (their depth is
  // bounded by the IR's kMaxNestingDepth), and the pieces of their
  // workspaces.
  exe->loop_index_.assign(num_ops, -1);
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (!IsLoopOp(op.kind)) continue;
    LoopPlan plan;
    PW_ASSIGN_OR_RETURN(plan.body, Compile(op.body, native));
    if (op.cond != nullptr) {
      PW_ASSIGN_OR_RETURN(plan.cond, Compile(op.cond, native));
    }
    const FunctionExecutable& body = *plan.body;
    const FunctionIr& f = body.ir();
    // What the loop's nested functions need: the most scratch, tiles and
    // gang temporaries of either (they run in turn), and whether one reads
    // other shards.
    int64_t nested_scratch = body.scratch_per_shard_;
    int64_t nested_tiles = body.tile_bytes_;
    int64_t nested_gang_temp = body.gang_temp_per_shard_;
    plan.cross_shard = body.has_cross_shard_;
    if (plan.cond != nullptr) {
      const FunctionExecutable& cond = *plan.cond;
      nested_scratch = std::max(nested_scratch, cond.scratch_per_shard_);
      nested_tiles = std::max(nested_tiles, cond.tile_bytes_);
      nested_gang_temp = std::max(nested_gang_temp, cond.gang_temp_per_shard_);
      plan.cross_shard = plan.cross_shard || cond.has_cross_shard_;
      plan.agree = body.first_collective_.kind != CollectiveCall::Kind::kNone ||
                   cond.first_collective_.kind != CollectiveCall::Kind::kNone;
    }
    int64_t end = nested_scratch;
    auto piece = [&](int64_t bytes) {
      const int64_t offset = end;
      end += RoundUp(bytes);
      return offset;
    };
    plan.pointers =
        piece(static_cast<int64_t>(sizeof(void*)) * (f.num_params() + f.num_outputs() + 1));
    const int nc = op.num_carries;
    const int nx = op.num_xs;
    for (int j = 0; j < nc; ++j) {
      plan.carry_a.push_back(piece(f.param_type(j).num_bytes()));
      plan.carry_b.push_back(piece(f.param_type(j).num_bytes()));
    }
    for (int k = nc; k < nc + nx; ++k) plan.slices.push_back(piece(f.param_type(k).num_bytes()));
    for (int j = nc; j < f.num_outputs(); ++j) plan.ys.push_back(piece(f.output_type(j).num_bytes()));
    for (int k = nc + nx; k < f.num_params(); ++k) {
      plan.consts.push_back(piece(f.param_type(k).num_bytes()));
    }
    if (plan.cond != nullptr) plan.flags = piece(1);
    plan.workspace_bytes = end;
    for (size_t j = 0; j < op.type.elements.size(); ++j) {
      plan.elements.push_back(ElementOffset(op.type, static_cast<int64_t>(j)));
    }
    exe->tile_bytes_ = std::max(exe->tile_bytes_, nested_tiles);
    exe->gang_temp_per_shard_ = std::max(exe->gang_temp_per_shard_, nested_gang_temp);
    if (plan.cross_shard) {
      // Run over the whole gang at the end of its stage, in the room after
      // the shards' regions (RunStageCollective): the workspace, the tiles.
      exe->gang_temp_per_shard_ =
          std::max(exe->gang_temp_per_shard_, plan.workspace_bytes + nested_tiles);
    }
    exe->loop_index_[v] = static_cast<int32_t>(exe->loop_plans_.size());
    exe->loop_plans_.push_back(std::move(plan));
  }
  // Linear algebra: the matrices, workspaces and tuple pieces.
  exe->linalg_index_.assign(num_ops, -1);
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (GetOpClass(op.kind) != OpClass::kLinalg) continue;
    const ValueType& in = ops[op.operands[0]].type;
    const size_t r = in.dims.size();
    LinalgPlan plan;
    plan.batch = kernels::DimProduct(in.dims, 0, r - 2);
    plan.m = in.dims[r - 2];
    plan.n = in.dims[r - 1];
    if (op.kind == OpKind::kSvd) {
      plan.workspace_bytes = kernels::SvdWorkspaceBytes(in.dtype, plan.m, plan.n, op.full_matrices);
    } else if (op.kind == OpKind::kLu) {
      plan.workspace_bytes = kernels::LuWorkspaceBytes(in.dtype, plan.n);
    } else if (op.kind == OpKind::kQr) {
      plan.workspace_bytes = kernels::QrWorkspaceBytes(in.dtype, plan.m, plan.n, op.full_matrices);
    } else if (op.kind == OpKind::kEigh) {
      plan.workspace_bytes = kernels::EighWorkspaceBytes(in.dtype, plan.n);
    } else if (op.kind == OpKind::kTriangularSolve) {  // b's columns
      plan.n = op.type.dims.back();
    }
    for (size_t j = 0; j < op.type.elements.size(); ++j) {
      plan.elements[j] = ElementOffset(op.type, static_cast<int64_t>(j));
    }
    exe->linalg_index_[v] = static_cast<int32_t>(exe->linalg_plans_.size());
    exe->linalg_plans_.push_back(plan);
  }
  // Ops that need the whole gang: cross-shard ops, and loops whose bodies
  // or conds have them.
  auto crosses_shards = [&](int32_t v) {
    return IsCrossShardKind(ops[v].kind) ||
           (exe->loop_index_[v] >= 0 &&
            exe->loop_plans_[static_cast<size_t>(exe->loop_index_[v])].cross_shard);
  };
  for (int32_t v = 0; v < num_ops; ++v) exe->has_cross_shard_ |= crosses_shards(v);

  // A matmul reads a transpose of the last two dims of its operand in place
  // (BLAS's trans flags: the gradients of a matmul and q @ k^T are such
  // products); a transpose that only such matmuls read is not run at all.
  auto swaps_last_two = [&](const Op& t) {
    const size_t r = t.axes.size();
    if (t.kind != OpKind::kTranspose || r < 2) return false;
    for (size_t d = 0; d + 2 < r; ++d) {
      if (t.axes[d] != static_cast<int64_t>(d)) return false;
    }
    return t.axes[r - 2] == static_cast<int64_t>(r - 1) && t.axes[r - 1] == static_cast<int64_t>(r - 2);
  };
  std::vector<int32_t> readers(num_ops, 0), absorbed(num_ops, 0);
  for (int32_t v : ir->outputs()) ++readers[v];
  for (int32_t v = 0; v < num_ops; ++v) {
    for (int32_t u : ops[v].operands) ++readers[u];
  }
  // Per op, the values it reads (a matmul's absorbed transposes replaced by
  // their operand).
  std::vector<absl::InlinedVector<int32_t, 2>> reads(num_ops);
  exe->skip_.assign(num_ops, 0);
  for (int32_t v = 0; v < num_ops; ++v) {
    reads[v] = ops[v].operands;
    if (ops[v].kind != OpKind::kMatmul) continue;
    for (int32_t& u : reads[v]) {
      if (swaps_last_two(ops[u])) {
        ++absorbed[u];
        u = ops[u].operands[0];
      }
    }
  }
  for (int32_t u = 0; u < num_ops; ++u) {
    exe->skip_[u] = absorbed[u] > 0 && absorbed[u] == readers[u];
  }

  // Last op that reads each value; outputs stay live past the last op.
  std::vector<int32_t> last_use(num_ops);
  for (int32_t i = 0; i < num_ops; ++i) {
    last_use[i] = i;
    if (exe->skip_[i]) continue;
    for (int32_t v : reads[i]) last_use[v] = i;
  }
  for (int32_t v : ir->outputs()) last_use[v] = num_ops;

  // Fusion groups: maximal runs of consecutive elementwise ops of one shape
  // whose operands are of that shape (and not constants) or scalar
  // constants, so every operand is read at the same flat index as the result.
  // A cross-shard op is never elementwise, so it ends a run: RunLocal handles
  // cross-shard ops one at a time, outside fused runs.
  auto fusible = [&](int32_t v) {
    const Op& op = ops[v];
    if (!IsElementwiseKind(op.kind) || op.kind == OpKind::kSimulatedCompute) return false;
    for (int32_t u : op.operands) {
      const Op& uo = ops[u];
      const bool constant = uo.kind == OpKind::kConstant;
      if (constant ? !uo.type.dims.empty() : uo.type.dims != op.type.dims) return false;
    }
    return true;
  };
  exe->group_start_.assign(num_ops, -1);
  exe->tile_offset_.assign(num_ops, -1);
  for (int32_t v = 0; v < num_ops;) {
    if (!fusible(v)) {
      ++v;
      continue;
    }
    // Parameters and constants compute nothing, so they may sit inside a run
    // (the tracer adds a constant just before the op that uses it).
    auto inert = [&](int32_t u) {
      return ops[u].kind == OpKind::kParameter || ops[u].kind == OpKind::kConstant;
    };
    int32_t last = v;
    for (int32_t next = v + 1; next < num_ops; ++next) {
      if (inert(next)) continue;
      if (!fusible(next) || ops[next].type.dims != ops[v].type.dims) break;
      last = next;
    }
    // Values used only inside the group get tile buffers (of the widest
    // element), reused once their last reader has run.
    constexpr int64_t kTileBytes = kTileElements * 8;
    int64_t tile_bytes = 0;
    std::vector<int64_t> free_tiles;
    for (int32_t u = v; u <= last; ++u) {
      for (int32_t w = v; w < u; ++w) {
        if (exe->tile_offset_[w] >= 0 && last_use[w] == u - 1) {
          free_tiles.push_back(exe->tile_offset_[w]);
        }
      }
      if (inert(u) || last_use[u] > last) continue;
      if (free_tiles.empty()) {
        exe->tile_offset_[u] = tile_bytes;
        tile_bytes += kTileBytes;
      } else {
        exe->tile_offset_[u] = free_tiles.back();
        free_tiles.pop_back();
      }
    }
    if (last > v && tile_bytes > 0) {
      exe->group_start_[v] = static_cast<int32_t>(exe->groups_.size());
      exe->groups_.push_back({v, last});
      exe->tile_bytes_ = std::max(exe->tile_bytes_, tile_bytes);
      // Tiles of later ops are computed after tiles of earlier ops have read
      // their operands, so every value read in the group stays live (keeps
      // its scratch slot) to the group's end.
      for (int32_t u = v; u <= last; ++u) {
        for (int32_t w : ops[u].operands) last_use[w] = std::max(last_use[w], last);
      }
    } else {
      for (int32_t u = v; u <= last; ++u) exe->tile_offset_[u] = -1;
    }
    v = last + 1;
  }

  // Native regions (codegen/fused_region.h), when native code is on. The
  // generated code reads a region's inputs after it has written some of its
  // outputs, so every value a region op reads stays live (keeps its slot) to
  // the region's end, as in a fusion group.
  exe->native_start_.assign(num_ops, -1);
  codegen::NativeCompiler& compiler = codegen::NativeCompiler::Default();
  if (native && compiler.enabled()) {
    std::vector<std::pair<int32_t, int32_t>> groups;
    for (const FusionGroup& g : exe->groups_) groups.push_back({g.first, g.last});
    std::vector<codegen::FusedRegion> regions = codegen::PlanFusedRegions(*ir, groups);
    for (const codegen::FusedRegion& r : regions) {
      NativeRegion nr;
      nr.first = r.first;
      nr.last = r.last;
      for (const codegen::RegionIo& io : r.inputs) nr.inputs.push_back(io.value);
      for (const codegen::RegionIo& io : r.outputs) {
        nr.outputs.push_back(io.value);
        int32_t direct = -1;
        int times = 0;
        for (int32_t i = 0; i < ir->num_outputs(); ++i) {
          if (ir->outputs()[i] == io.value) {
            direct = i;
            ++times;
          }
        }
        bool read_after = false;
        for (int32_t u = r.last + 1; u < num_ops && !read_after; ++u) {
          for (int32_t w : ops[u].operands) read_after = read_after || w == io.value;
        }
        nr.direct.push_back(times == 1 && !read_after && direct < 64 ? direct : -1);
      }
      nr.rows = r.rows;
      nr.cols = r.cols;
      nr.split_rows = r.split_rows;
      nr.split_cols = r.split_cols;
      exe->native_start_[r.first] = static_cast<int32_t>(exe->native_regions_.size());
      exe->native_regions_.push_back(std::move(nr));
      for (int32_t u = r.first; u <= r.last; ++u) {
        for (int32_t w : ops[u].operands) last_use[w] = std::max(last_use[w], r.last);
      }
    }
    if (!regions.empty()) {
      exe->native_ = std::make_shared<codegen::NativeJob>();
      exe->native_->source = codegen::EmitNativeSource(regions);
      exe->native_->num_regions = static_cast<int>(regions.size());
      compiler.Register(exe->native_);
    }
  }

  // Parameters are read in place and constants straight from their literal;
  // every other value gets a scratch slot, except values internal to a fusion
  // group, and a reshape of a value that dies at it, which shares its slot. First fit over the slots of values still live at its definition,
  // so dead intermediates are reused. A value never shares a slot with its
  // operands (they are live at its definition).
  exe->scratch_offset_.assign(num_ops, -1);
  struct Slot {
    int64_t offset;
    int64_t size;
  };
  std::vector<Slot> live;
  // First fit among the slots of values live at op v (and `also`).
  auto first_fit = [&](int32_t v, int64_t size, const Slot* also) {
    live.clear();
    for (int32_t u = 0; u < v; ++u) {
      if (exe->scratch_offset_[u] >= 0 && last_use[u] >= v) {
        live.push_back({exe->scratch_offset_[u], SlotBytes(ops[u].type)});
      }
    }
    if (also != nullptr) live.push_back(*also);
    std::sort(live.begin(), live.end(),
              [](const Slot& a, const Slot& b) { return a.offset < b.offset; });
    int64_t offset = 0;
    for (const Slot& s : live) {
      if (offset + size <= s.offset) break;
      offset = std::max(offset, s.offset + s.size);
    }
    exe->scratch_per_shard_ = std::max(exe->scratch_per_shard_, offset + size);
    return offset;
  };
  for (int32_t v = 0; v < num_ops; ++v) {
    const OpKind kind = ops[v].kind;
    if (kind == OpKind::kGetElement) {
      // Its piece of the tuple's slot: nothing to run. The piece stays
      // taken while the element is live, as any value's slot.
      const int32_t t = ops[v].operands[0];
      exe->scratch_offset_[v] = exe->scratch_offset_[t] + ElementOffset(ops[t].type, ops[v].index);
      exe->skip_[v] = 1;
      continue;
    }
    if (kind == OpKind::kParameter || kind == OpKind::kConstant || exe->tile_offset_[v] >= 0 ||
        exe->skip_[v]) {
      continue;
    }
    if (kind == OpKind::kReshape) {
      // A reshape whose operand dies here takes the operand's slot: the same
      // bytes in the same (row-major) order, so there is nothing to run.
      const int32_t u = ops[v].operands[0];
      if (exe->scratch_offset_[u] >= 0 && last_use[u] == v) {
        exe->scratch_offset_[v] = exe->scratch_offset_[u];
        exe->skip_[v] = 1;
        continue;
      }
    }
    const int64_t size = SlotBytes(ops[v].type);
    exe->scratch_offset_[v] = first_fit(v, size, nullptr);
    if (exe->loop_index_[v] >= 0) {
      // The workspace is needed during the loop only: a slot of its own,
      // apart from the operands' and the results'.
      LoopPlan& sp = exe->loop_plans_[static_cast<size_t>(exe->loop_index_[v])];
      const Slot results{exe->scratch_offset_[v], size};
      sp.workspace = first_fit(v, sp.workspace_bytes, &results);
    }
    if (exe->linalg_index_[v] >= 0) {  // the same for LAPACK's workspace
      LinalgPlan& lp = exe->linalg_plans_[static_cast<size_t>(exe->linalg_index_[v])];
      if (lp.workspace_bytes > 0) {
        const Slot results{exe->scratch_offset_[v], size};
        lp.workspace = first_fit(v, lp.workspace_bytes, &results);
      }
    }
  }

  // RunLocal's full-gang temporaries (see gang_temp_per_shard_) and its
  // first call to its collectives. axis_index reads no operand and writes
  // the local shards directly.
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (exe->loop_index_[v] >= 0) {
      const LoopPlan& lp = exe->loop_plans_[static_cast<size_t>(exe->loop_index_[v])];
      // A scan calls what its body calls, from the first iteration on; a
      // while what its cond calls, which runs first, then (when it calls
      // nothing) its agreement whether to go on (see "Loops").
      CollectiveCall first;
      if (op.kind == OpKind::kScan) {
        if (op.length > 0) first = lp.body->first_collective_;
      } else if (lp.cond->first_collective_.kind != CollectiveCall::Kind::kNone) {
        first = lp.cond->first_collective_;
      } else if (lp.agree) {
        first.kind = CollectiveCall::Kind::kAllReduce;
        first.dtype = DType::kBool;
        first.op = ReduceOp::kMax;
        first.count = 1;
      }
      if (first.kind != CollectiveCall::Kind::kNone &&
          exe->first_collective_.kind == CollectiveCall::Kind::kNone) {
        exe->first_collective_ = first;
      }
      continue;
    }
    if (!IsCrossShardKind(op.kind) || op.kind == OpKind::kAxisIndex) continue;
    const Op& in = ops[op.operands[0]];
    const int64_t in_bytes = in.kind == OpKind::kConstant ? 0 : RoundUp(in.type.num_bytes());
    exe->gang_temp_per_shard_ =
        std::max(exe->gang_temp_per_shard_, in_bytes + RoundUp(op.type.num_bytes()));
    if (in_bytes == 0 || exe->first_collective_.kind != CollectiveCall::Kind::kNone) continue;
    CollectiveCall& call = exe->first_collective_;
    if (std::optional<ReduceOp> reduce = HostReduction(op.kind, op.type.dtype)) {
      call.kind = CollectiveCall::Kind::kAllReduce;
      call.op = *reduce;
      call.dtype = op.kind == OpKind::kPmean ? DType::kF64 : op.type.dtype;
      call.count = op.type.num_elements();
    } else {
      call.kind = CollectiveCall::Kind::kAllGather;
      call.shard_bytes = in.type.num_bytes();
    }
  }

  // Broadcast plans for ops with an operand that is neither a scalar nor of
  // the result's shape.
  exe->plan_index_.assign(num_ops, -1);
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (!IsBinaryKind(op.kind) && !IsComparisonKind(op.kind) && op.kind != OpKind::kSelect) {
      continue;
    }
    const Dims& dims = op.type.dims;
    const bool needed = std::any_of(op.operands.begin(), op.operands.end(), [&](int32_t u) {
      const Dims& od = ops[u].type.dims;
      return !od.empty() && od != dims;
    });
    if (!needed || dims.empty()) continue;
    BroadcastPlan plan;
    plan.dims = dims;
    const size_t rank = dims.size();
    plan.row_div.assign(rank, 1);
    for (size_t d = rank - 1; d-- > 0;) {
      plan.row_div[d] = d + 2 < rank ? plan.row_div[d + 1] * dims[d + 1] : 1;
    }
    for (int32_t u : op.operands) {
      const Dims& od = ops[u].type.dims;
      Dims strides(rank, 0);
      int64_t stride = 1;
      for (size_t i = 0; i < od.size(); ++i) {  // from the right
        const size_t k = od.size() - 1 - i;
        const size_t d = rank - 1 - i;
        strides[d] = od[k] == 1 ? 0 : stride;
        stride *= od[k];
      }
      plan.strides.push_back(std::move(strides));
    }
    exe->plan_index_[v] = static_cast<int32_t>(exe->plans_.size());
    exe->plans_.push_back(std::move(plan));
  }
  // Reduce plans.
  exe->reduce_index_.assign(num_ops, -1);
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (op.kind != OpKind::kReduce) continue;
    ReducePlan plan = kernels::MakeReducePlan(ops[op.operands[0]].type.dims, op.axes);
    exe->reduce_index_[v] = static_cast<int32_t>(exe->reduce_plans_.size());
    exe->reduce_plans_.push_back(std::move(plan));
  }
  // Copy plans of the data-movement ops, and matmul offsets.
  exe->copy_range_.assign(num_ops, {0, 0});
  exe->matmul_index_.assign(num_ops, -1);
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (IsDataMovementKind(op.kind)) {
      if (op.kind == OpKind::kAllToAll && ir->axis_size() < 1) {
        return absl::FailedPreconditionError(
            absl::StrCat("compile: @", ir->name(), ": all_to_all needs the axis size"));
      }
      PW_ASSIGN_OR_RETURN(std::vector<CopyPlan> plans, MakeCopyPlans(*ir, v));
      exe->copy_range_[v] = {static_cast<int32_t>(exe->copy_plans_.size()),
                             static_cast<int32_t>(plans.size())};
      for (CopyPlan& p : plans) exe->copy_plans_.push_back(std::move(p));
    } else if (op.kind == OpKind::kMatmul) {
      exe->matmul_index_[v] = static_cast<int32_t>(exe->matmul_plans_.size());
      MatmulPlan plan = MakeMatmulPlan(ops[op.operands[0]].type.dims, ops[op.operands[1]].type.dims);
      plan.a = reads[v][0];
      plan.b = reads[v][1];
      plan.trans_a = plan.a != op.operands[0];
      plan.trans_b = plan.b != op.operands[1];
      exe->matmul_plans_.push_back(std::move(plan));
    }
  }
  // Stages for shard-parallel runs: cut after each cross-shard op. A fused
  // run has no cross-shard op inside, so it stays within one stage. Each
  // stage's work, and the function's, per shard.
  int32_t begin = 0;
  int64_t stage_work = 0;
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
    if (crosses_shards(v)) {
      exe->stages_.push_back({begin, v, v, stage_work});
      begin = v + 1;
      stage_work = 0;
    }
    if (op.kind == OpKind::kParameter || op.kind == OpKind::kConstant || exe->skip_[v]) continue;
    int64_t work = op.type.num_elements();
    if (op.kind == OpKind::kTopK) work += ops[op.operands[0]].type.num_elements();  // reads every row
    if (op.kind == OpKind::kScatter) work += ops[op.operands[2]].type.num_elements();
    if (op.kind == OpKind::kSort) {  // n log n comparisons per row of n
      int64_t log_n = 1;
      while ((int64_t{1} << log_n) < op.type.dims.back()) ++log_n;
      work *= log_n;
    }
    if (exe->loop_index_[v] >= 0) {
      const LoopPlan& sp = exe->loop_plans_[static_cast<size_t>(exe->loop_index_[v])];
      // Saturated: it only decides whether to split a gang over threads, and
      // a decoded function's length may be anything. A while's trip count
      // is unknown: counted as one iteration.
      constexpr int64_t kMaxWork = int64_t{1} << 40;
      int64_t loop = 0;
      const int64_t trips = op.kind == OpKind::kScan ? op.length : 1;
      int64_t iteration = sp.body->work_per_shard_;
      if (sp.cond != nullptr) iteration += sp.cond->work_per_shard_;
      if (__builtin_mul_overflow(trips, iteration, &loop) || loop > kMaxWork) {
        loop = kMaxWork;
      }
      work += loop;
    }
    if (exe->linalg_index_[v] >= 0) {  // O(m n min(m, n)) flops per matrix (trsm: m m n)
      const LinalgPlan& lp = exe->linalg_plans_[static_cast<size_t>(exe->linalg_index_[v])];
      work += lp.batch * lp.m * lp.n * (op.kind == OpKind::kTriangularSolve ? lp.m : std::min(lp.m, lp.n));
    }
    if (op.kind == OpKind::kMatmul) {
      const MatmulPlan& mp = exe->matmul_plans_[static_cast<size_t>(exe->matmul_index_[v])];
      work += mp.m * mp.n * mp.k * static_cast<int64_t>(mp.a_offsets.size()) / 8;
    }
    exe->work_per_shard_ += work;
    if (!crosses_shards(v)) stage_work += work;
  }
  exe->stages_.push_back({begin, num_ops, -1, stage_work});
  return std::shared_ptr<const FunctionExecutable>(std::move(exe));
}

FunctionExecutable::MatmulPlan FunctionExecutable::MakeMatmulPlan(const Dims& a, const Dims& b) {
  MatmulPlan plan;
  const size_t ra = a.size();
  const size_t rb = b.size();
  plan.m = a[ra - 2];
  plan.k = a[ra - 1];
  plan.n = b[rb - 1];
  Dims batch;
  BroadcastDims(absl::MakeConstSpan(a).subspan(0, ra - 2),
                absl::MakeConstSpan(b).subspan(0, rb - 2), &batch);
  const int64_t count = NumElements(batch);
  // Element strides of each operand's batch dims, aligned right with the
  // broadcast batch dims (0 where the operand has size 1 or lacks the dim).
  auto batch_strides = [&](const Dims& dims) {
    const size_t r = dims.size() - 2;
    Dims strides(batch.size(), 0);
    int64_t stride = dims[r] * dims[r + 1];
    for (size_t i = 0; i < r; ++i) {
      const size_t d = r - 1 - i;
      const size_t bd = batch.size() - 1 - i;
      strides[bd] = dims[d] == 1 ? 0 : stride;
      stride *= dims[d];
    }
    return strides;
  };
  const Dims sa = batch_strides(a);
  const Dims sb = batch_strides(b);
  for (int64_t i = 0; i < count; ++i) {
    plan.a_offsets.push_back(Offset(i, batch, sa));
    plan.b_offsets.push_back(Offset(i, batch, sb));
  }
  return plan;
}

}  // namespace pw
