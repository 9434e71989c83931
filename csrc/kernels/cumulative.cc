#include "csrc/kernels/cumulative.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "csrc/kernels/kernel_util.h"

namespace pw::kernels {
namespace {

template <typename T, typename F>
void Accumulate(int64_t outer, int64_t dim, int64_t inner, bool reverse, const T* x, T* out,
                F combine) {
  if (dim == 0 || inner == 0) return;
  // Step from row `from` to row `to` of each block: +inner forward, -inner
  // in reverse.
  const int64_t first = reverse ? dim - 1 : 0;
  const int64_t step = reverse ? -inner : inner;
  for (int64_t o = 0; o < outer; ++o) {
    const T* xb = x + (o * dim + first) * inner;
    T* ob = out + (o * dim + first) * inner;
    std::copy_n(xb, inner, ob);
    for (int64_t j = 1; j < dim; ++j) {
      const T* xr = xb + j * step;
      T* prev = ob + (j - 1) * step;
      T* cur = ob + j * step;
      for (int64_t i = 0; i < inner; ++i) cur[i] = combine(prev[i], xr[i]);
    }
  }
}

template <typename T>
void CumulativeOf(Combiner combiner, int64_t outer, int64_t dim, int64_t inner, bool reverse,
                  const T* x, T* out) {
  auto run = [&](auto f) { Accumulate(outer, dim, inner, reverse, x, out, f); };
  switch (combiner) {
    case Combiner::kAdd:
      return run([](T a, T b) { return ReduceAdd(a, b); });
    case Combiner::kMul:
      if constexpr (std::is_same_v<T, int32_t>) {
        return run([](T a, T b) { return Wrap(static_cast<uint32_t>(a) * static_cast<uint32_t>(b)); });
      } else {
        return run([](T a, T b) { return static_cast<T>(a * b); });
      }
    case Combiner::kMax:
      return run([](T a, T b) { return Max(a, b); });
    case Combiner::kMin:
      return run([](T a, T b) { return Min(a, b); });
    case Combiner::kSet:
      return;  // the builder refuses it
  }
}

}  // namespace

void CumulativeRows(Combiner combiner, DType dtype, int64_t outer, int64_t dim, int64_t inner,
                    bool reverse, const void* x, void* out) {
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    CumulativeOf<T>(combiner, outer, dim, inner, reverse, static_cast<const T*>(x),
                    static_cast<T*>(out));
  });
}

}  // namespace pw::kernels
