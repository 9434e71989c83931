#include "csrc/kernels/data_movement.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/kernels/kernel_util.h"

namespace pw {
namespace {

template <typename T, typename F>
void ScatterRowsOf(int64_t outer, int64_t dim, int64_t inner, const T* operand, bool scalar_operand,
                   const T* updates, const int32_t* indices, int64_t num_indices,
                   int64_t index_stride, T* out, F combine) {
  const int64_t n = outer * dim * inner;
  if (scalar_operand) {
    std::fill(out, out + n, operand[0]);
  } else {
    std::copy_n(operand, n, out);
  }
  if (inner == 0) return;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < num_indices; ++j) {
      const int32_t k = indices[j * index_stride];
      if (k < 0 || k >= dim) continue;  // dropped, as JAX's scatters
      T* dst = out + (o * dim + k) * inner;
      const T* src = updates + (o * num_indices + j) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = combine(dst[i], src[i]);
    }
  }
}

// Row-major element strides of `dims`.
Dims ContiguousStrides(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) strides[d - 1] = strides[d] * dims[d];
  return strides;
}

// Drops size-1 dimensions and merges dimension d into d+1 where both sides
// step over d+1 exactly (so a contiguous copy becomes one run).
void Simplify(CopyPlan& p) {
  CopyPlan out = p;
  out.dims.clear();
  out.src_strides.clear();
  out.dst_strides.clear();
  for (size_t d = 0; d < p.dims.size(); ++d) {
    if (p.dims[d] == 1) continue;
    if (!out.dims.empty() && out.src_strides.back() == p.src_strides[d] * p.dims[d] &&
        out.dst_strides.back() == p.dst_strides[d] * p.dims[d]) {
      out.dims.back() *= p.dims[d];
      out.src_strides.back() = p.src_strides[d];
      out.dst_strides.back() = p.dst_strides[d];
      continue;
    }
    out.dims.push_back(p.dims[d]);
    out.src_strides.push_back(p.src_strides[d]);
    out.dst_strides.push_back(p.dst_strides[d]);
  }
  p = std::move(out);
}

template <typename E>
void CopyElements(const CopyPlan& p, const E* src, E* dst) {
  int64_t total = 1;
  for (int64_t d : p.dims) total *= d;
  // Before any pointer arithmetic: an empty value's pointer may be null.
  if (total == 0) return;
  src += p.src_offset;
  dst += p.dst_offset;
  const size_t rank = p.dims.size();
  if (rank == 0) {
    *dst = *src;
    return;
  }
  const int64_t inner = p.dims[rank - 1];
  const int64_t ss = p.src_strides[rank - 1];
  const int64_t ds = p.dst_strides[rank - 1];
  int64_t index[kMaxCopyRank] = {};
  for (int64_t row = 0, rows = total / inner; row < rows; ++row) {
    if (ss == 1 && ds == 1) {
      std::memcpy(dst, src, static_cast<size_t>(inner) * sizeof(E));
    } else {
      for (int64_t i = 0; i < inner; ++i) dst[i * ds] = src[i * ss];
    }
    // Next row: an odometer over the outer dimensions.
    for (size_t k = rank - 1; k-- > 0;) {
      src += p.src_strides[k];
      dst += p.dst_strides[k];
      if (++index[k] < p.dims[k]) break;
      src -= p.src_strides[k] * p.dims[k];
      dst -= p.dst_strides[k] * p.dims[k];
      index[k] = 0;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<CopyPlan>> MakeCopyPlans(const FunctionIr& ir, int32_t v) {
  const Op& op = ir.ops()[v];
  const Dims& out = op.type.dims;
  const Dims out_strides = ContiguousStrides(out);
  const Dims& in = ir.ops()[op.operands[0]].type.dims;
  const Dims in_strides = ContiguousStrides(in);
  std::vector<CopyPlan> plans;
  CopyPlan p;
  switch (op.kind) {
    case OpKind::kCopy:
    case OpKind::kReshape:
      p.dims = {op.type.num_elements()};
      p.src_strides = p.dst_strides = {1};
      plans.push_back(p);
      break;
    case OpKind::kBroadcastTo: {
      p.dims = out;
      p.dst_strides = out_strides;
      p.src_strides.assign(out.size(), 0);
      const size_t lead = out.size() - in.size();
      for (size_t d = 0; d < in.size(); ++d) {
        p.src_strides[lead + d] = in[d] == 1 ? 0 : in_strides[d];
      }
      plans.push_back(p);
      break;
    }
    case OpKind::kTranspose:
      p.dims = out;
      p.dst_strides = out_strides;
      for (int64_t a : op.axes) p.src_strides.push_back(in_strides[a]);
      plans.push_back(p);
      break;
    case OpKind::kSlice:
      p.dims = out;
      p.dst_strides = out_strides;
      for (size_t d = 0; d < in.size(); ++d) {
        p.src_offset += op.slice_start[d] * in_strides[d];
        p.src_strides.push_back(op.slice_step[d] * in_strides[d]);
      }
      plans.push_back(p);
      break;
    case OpKind::kRev:
      p.dims = in;
      p.dst_strides = out_strides;
      p.src_strides = in_strides;
      for (int64_t a : op.axes) {
        p.src_offset += (in[a] - 1) * in_strides[a];
        p.src_strides[a] = -in_strides[a];
      }
      plans.push_back(p);
      break;
    case OpKind::kPad:  // the kernel zero-fills the result first
      p.dims = in;
      p.src_strides = in_strides;
      for (size_t d = 0; d < in.size(); ++d) {
        p.dst_offset += op.pad_lo[d] * out_strides[d];
        p.dst_strides.push_back((op.pad_interior[d] + 1) * out_strides[d]);
      }
      plans.push_back(p);
      break;
    case OpKind::kConcatenate: {
      int64_t at = 0;
      for (size_t k = 0; k < op.operands.size(); ++k) {
        const Dims& dims = ir.ops()[op.operands[k]].type.dims;
        CopyPlan q;
        q.operand = static_cast<int32_t>(k);
        q.dims = dims;
        q.src_strides = ContiguousStrides(dims);
        q.dst_strides = out_strides;
        q.dst_offset = at * out_strides[op.axis];
        at += dims[op.axis];
        plans.push_back(std::move(q));
      }
      break;
    }
    case OpKind::kAllToAll: {
      const int64_t n = ir.axis_size();
      p.dims = in;
      p.dims[op.axis] = in[op.axis] / n;  // one chunk
      p.src_strides = in_strides;
      p.dst_strides = out_strides;
      p.src_shard_step = p.dims[op.axis] * in_strides[op.axis];
      p.dst_shard_step = p.dims[op.concat_axis] * out_strides[op.concat_axis];
      plans.push_back(p);
      break;
    }
    default:
      return absl::InternalError(
          absl::StrCat("copy plan: ", OpKindName(op.kind), " is not a data-movement op"));
  }
  for (CopyPlan& q : plans) {
    Simplify(q);
    if (q.dims.size() > static_cast<size_t>(kMaxCopyRank)) {
      return absl::UnimplementedError(absl::StrCat(
          OpKindName(op.kind), ": ", op.type.ToString(), " needs a copy of ", q.dims.size(),
          " non-contiguous dimensions; at most ", kMaxCopyRank, " are supported"));
    }
  }
  return plans;
}

void StridedCopy(const CopyPlan& plan, int64_t elem_size, const void* src, void* dst) {
  switch (elem_size) {
    case 1:
      return CopyElements(plan, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst));
    case 2:  // bfloat16
      return CopyElements(plan, static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst));
    case 4:
      return CopyElements(plan, static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst));
    default:
      return CopyElements(plan, static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst));
  }
}

void TakeRows(int64_t elem_size, int64_t outer, int64_t dim, int64_t inner, const void* x,
              const int32_t* indices, int64_t num_indices, int64_t index_stride, void* out) {
  const auto* px = static_cast<const uint8_t*>(x);
  auto* po = static_cast<uint8_t*>(out);
  const size_t row = static_cast<size_t>(inner * elem_size);
  if (row == 0) return;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < num_indices; ++j) {
      const int64_t k = ClipIndex(indices[j * index_stride], dim);
      std::memcpy(po + ((o * num_indices + j) * inner) * elem_size,
                  px + ((o * dim + k) * inner) * elem_size, row);
    }
  }
}

void ScatterRows(Combiner combiner, DType dtype, int64_t outer, int64_t dim, int64_t inner,
                 const void* operand, bool scalar_operand, const void* updates,
                 const int32_t* indices, int64_t num_indices, int64_t index_stride, void* out) {
  kernels::DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto run = [&](auto combine) {
      ScatterRowsOf<T>(outer, dim, inner, static_cast<const T*>(operand), scalar_operand,
                       static_cast<const T*>(updates), indices, num_indices, index_stride,
                       static_cast<T*>(out), combine);
    };
    switch (combiner) {
      case Combiner::kSet:
        return run([](T, T u) { return u; });
      case Combiner::kAdd:
        return run([](T a, T u) { return kernels::ReduceAdd(a, u); });
      case Combiner::kMul:
        if constexpr (std::is_same_v<T, int32_t>) {
          return run([](T a, T u) {
            return kernels::Wrap(static_cast<uint32_t>(a) * static_cast<uint32_t>(u));
          });
        } else {
          return run([](T a, T u) { return static_cast<T>(a * u); });
        }
      case Combiner::kMax:
        return run([](T a, T u) { return kernels::Max(a, u); });
      case Combiner::kMin:
        return run([](T a, T u) { return kernels::Min(a, u); });
    }
  });
}

}  // namespace pw
