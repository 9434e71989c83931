#include "csrc/kernels/reduction.h"

#include <type_traits>

namespace pw::kernels {
namespace {

// numpy's sum/mean/max/min/argmax over the plan's reduced dims, per shard.
template <typename T>
void Reduce(ReduceKind kind, int num_shards, int64_t n, const View& x,
            const ReducePlan& plan, void* out_ptr) {
  const T* px = static_cast<const T*>(x.data);
  const int64_t rc = plan.red_count;
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

void RunReduce(ReduceKind kind, DType in_dtype, int num_shards, int64_t n, const View& x,
               const ReducePlan& plan, void* out) {
  DispatchDType(in_dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    Reduce<T>(kind, num_shards, n, x, plan, out);
  });
}

}  // namespace pw::kernels
