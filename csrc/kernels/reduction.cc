#include "csrc/kernels/reduction.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace pw::kernels {
namespace {

// One reduction of a contiguous run of n >= 1 elements.
template <typename T>
T ReduceRun(ReduceKind kind, const T* x, int64_t n) {
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kMean:
      if constexpr (std::is_floating_point_v<T>) {
        const T sum = PairwiseSum(x, n);
        return kind == ReduceKind::kMean ? sum / static_cast<T>(n) : sum;
      } else {
        T acc = T(0);  // integers wrap and bools or: the order does not matter
        for (int64_t i = 0; i < n; ++i) acc = ReduceAdd<T>(acc, x[i]);
        return acc;
      }
    case ReduceKind::kMax:
    case ReduceKind::kMin:
      return RunMax(x, n, kind == ReduceKind::kMax);
    case ReduceKind::kArgmax:
      break;  // not here
  }
  return T(0);
}

// out[o, i] = reduction over r of x[o, r, i] (one shard), in order of r.
template <typename T>
void ReduceColumns(ReduceKind kind, const T* x, int64_t outer, int64_t red, int64_t inner, T* out) {
  for (int64_t o = 0; o < outer; ++o) {
    const T* xo = x + o * red * inner;
    T* oo = out + o * inner;
    std::copy(xo, xo + inner, oo);
    for (int64_t r = 1; r < red; ++r) {
      const T* row = xo + r * inner;
      switch (kind) {
        case ReduceKind::kSum:
        case ReduceKind::kMean:
          for (int64_t i = 0; i < inner; ++i) oo[i] = ReduceAdd<T>(oo[i], row[i]);
          break;
        case ReduceKind::kMax:
          for (int64_t i = 0; i < inner; ++i) oo[i] = Max(oo[i], row[i]);
          break;
        default:
          for (int64_t i = 0; i < inner; ++i) oo[i] = Min(oo[i], row[i]);
          break;
      }
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (kind == ReduceKind::kMean) {
        for (int64_t i = 0; i < inner; ++i) oo[i] = oo[i] / static_cast<T>(red);
      }
    }
  }
}

// numpy's sum/mean/max/min/argmax over the plan's reduced dims, per shard.
template <typename T>
void Reduce(ReduceKind kind, int num_shards, int64_t n, const View& x,
            const ReducePlan& plan, void* out_ptr) {
  const T* px = static_cast<const T*>(x.data);
  const int64_t rc = plan.red_count;
  // The fast paths: a full operand (not a broadcast scalar), nonempty
  // reductions, not argmax (first occurrence, NaN rules: the general loop).
  if (x.elem_stride == 1 && rc > 0 && n > 0 && kind != ReduceKind::kArgmax &&
      plan.layout != ReducePlan::Layout::kGeneral) {
    for (int s = 0; s < num_shards; ++s) {
      const T* rx = px + s * x.shard_stride;
      T* out = static_cast<T*>(out_ptr) + s * n;
      if (plan.layout == ReducePlan::Layout::kRows) {
        for (int64_t o = 0; o < plan.outer; ++o) out[o] = ReduceRun<T>(kind, rx + o * rc, rc);
      } else {
        ReduceColumns<T>(kind, rx, plan.outer, rc, plan.inner, out);
      }
    }
    return;
  }
  for (int s = 0; s < num_shards; ++s) {
    const T* rx = px + s * x.shard_stride;
    for (int64_t o = 0; o < n; ++o) {
      const T* row = rx + (x.elem_stride == 0 ? 0 : Offset(o, plan.kept_dims, plan.kept_strides));
      auto at = [&](int64_t r) {
        return x.elem_stride == 0 ? row[0] : row[Offset(r, plan.red_dims, plan.red_strides)];
      };
      if (kind == ReduceKind::kArgmax) {
        int32_t best_i = 0;
        T best = at(0);
        if constexpr (std::is_floating_point_v<T>) {
          if (best != best) {  // NOLINT: NaN check; numpy: first NaN wins
            static_cast<int32_t*>(out_ptr)[s * n + o] = 0;
            continue;
          }
        }
        for (int64_t r = 1; r < rc; ++r) {
          const T v = at(r);
          if constexpr (std::is_floating_point_v<T>) {
            if (v != v) {  // NOLINT: NaN check
              best_i = static_cast<int32_t>(r);
              break;
            }
          }
          if (v > best) {
            best = v;
            best_i = static_cast<int32_t>(r);
          }
        }
        static_cast<int32_t*>(out_ptr)[s * n + o] = best_i;
        continue;
      }
      T* out = static_cast<T*>(out_ptr) + s * n + o;
      if (kind == ReduceKind::kSum || kind == ReduceKind::kMean) {
        T acc = T(0);
        for (int64_t r = 0; r < rc; ++r) acc = ReduceAdd<T>(acc, at(r));
        if constexpr (std::is_floating_point_v<T>) {
          if (kind == ReduceKind::kMean) acc = acc / static_cast<T>(rc);
        }
        *out = acc;
      } else {
        T acc = at(0);
        for (int64_t r = 1; r < rc; ++r) {
          acc = kind == ReduceKind::kMax ? Max(acc, at(r)) : Min(acc, at(r));
        }
        *out = acc;
      }
    }
  }
}

}  // namespace

ReducePlan MakeReducePlan(const Dims& in, absl::Span<const int64_t> axes) {
  ReducePlan plan;
  int64_t stride = 1;
  Dims strides(in.size(), 0);
  for (size_t d = in.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= in[d];
  }
  // Runs of kept and reduced dims, size-1 dims dropped: "K", "R", "KR",
  // "RK", "KRK" take a fast path.
  std::string pattern;
  std::vector<int64_t> sizes;
  size_t k = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    const bool reduced = k < axes.size() && axes[k] == static_cast<int64_t>(d);
    if (reduced) {
      plan.red_dims.push_back(in[d]);
      plan.red_strides.push_back(strides[d]);
      plan.red_count *= in[d];
      ++k;
    } else {
      plan.kept_dims.push_back(in[d]);
      plan.kept_strides.push_back(strides[d]);
    }
    if (in[d] == 1) continue;
    const char c = reduced ? 'R' : 'K';
    if (!pattern.empty() && pattern.back() == c) {
      sizes.back() *= in[d];
    } else {
      pattern.push_back(c);
      sizes.push_back(in[d]);
    }
  }
  if (pattern.empty() || pattern == "R" || pattern == "K" || pattern == "KR") {
    plan.layout = ReducePlan::Layout::kRows;
    plan.outer = pattern.empty() || pattern == "R" ? 1 : sizes[0];
    if (pattern == "K") plan.outer = sizes[0];  // reduced dims all of size 1
  } else if (pattern == "RK" || pattern == "KRK") {
    plan.layout = ReducePlan::Layout::kColumns;
    plan.outer = pattern == "KRK" ? sizes[0] : 1;
    plan.inner = sizes.back();
  }
  return plan;
}

void RunReduce(ReduceKind kind, DType in_dtype, int num_shards, int64_t n, const View& x,
               const ReducePlan& plan, void* out) {
  DispatchDType(in_dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    Reduce<T>(kind, num_shards, n, x, plan, out);
  });
}

}  // namespace pw::kernels
