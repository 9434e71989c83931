#include "csrc/kernels/function_executable.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/status_macros.h"
#include "csrc/kernels/matmul.h"

namespace pw {
namespace {

constexpr int64_t kAlignment = 64;

int64_t RoundUp(int64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// Where the elements of one value live for the whole gang: element j of shard
// s is data[s * shard_stride + j * elem_stride] (strides in elements).
// Parameters and scratch values have shard_stride = num_elements; constants
// are shared by all shards (shard_stride 0); scalars have elem_stride 0 so
// they broadcast against a full operand.
struct View {
  const void* data;
  int64_t shard_stride;
  int64_t elem_stride;
};

// 1 if the view's elements for a result of n elements per shard sit at flat
// index i (one loop over the gang), 0 if they are all the same element, -1 if
// neither.
int FlatStride(const View& v, int64_t n) {
  if (v.shard_stride == n && (v.elem_stride == 1 || n == 1)) return 1;
  if (v.shard_stride == 0 && v.elem_stride == 0) return 0;
  return -1;
}

template <typename In, typename Out, typename F>
void Map1(int num_shards, int64_t n, View x, Out* out, F f) {
  const In* px = static_cast<const In*>(x.data);
  const int64_t total = num_shards * n;
  switch (FlatStride(x, n)) {
    case 1:
      for (int64_t i = 0; i < total; ++i) out[i] = f(px[i]);
      return;
    case 0:
      std::fill(out, out + total, f(px[0]));
      return;
    default:
      for (int s = 0; s < num_shards; ++s) {
        const In* rx = px + s * x.shard_stride;
        Out* ro = out + s * n;
        for (int64_t j = 0; j < n; ++j) ro[j] = f(rx[j * x.elem_stride]);
      }
  }
}

using BroadcastPlan = FunctionExecutable::BroadcastPlan;

// One operand of a broadcasting op: its elements for shard s start at
// p + s * shard_stride; strides come from the op's BroadcastPlan.
template <typename T>
struct Operand {
  const T* p;
  int64_t shard_stride;
  const int64_t* strides;
};

template <typename T>
Operand<T> MakeOperand(const View& v, const BroadcastPlan& plan, int k) {
  return {static_cast<const T*>(v.data), v.shard_stride, plan.strides[k].data()};
}

template <typename Out, typename F, typename... In>
void BroadcastRow(Out* ro, int64_t last, F& f, std::pair<const In*, int64_t>... args) {
  for (int64_t t = 0; t < last; ++t) ro[t] = f(args.first[t * args.second]...);
}

// The general numpy-broadcasting loop: rows of the last dimension, the
// offset of each operand's row computed from the row index (O(rank) per row).
template <typename Out, typename F, typename... In>
void MapBroadcast(int num_shards, const BroadcastPlan& plan, Out* out, F f,
                  Operand<In>... ops) {
  const size_t rank = plan.dims.size();
  const int64_t n = NumElements(plan.dims);
  if (n == 0) return;
  const int64_t last = plan.dims[rank - 1];
  const int64_t rows = n / last;
  for (int s = 0; s < num_shards; ++s) {
    for (int64_t r = 0; r < rows; ++r) {
      auto row_start = [&](const auto& o) {
        int64_t off = s * o.shard_stride;
        for (size_t d = 0; d + 1 < rank; ++d) {
          off += ((r / plan.row_div[d]) % plan.dims[d]) * o.strides[d];
        }
        return off;
      };
      BroadcastRow<Out, F, In...>(
          out + s * n + r * last, last, f,
          std::pair<const In*, int64_t>(ops.p + row_start(ops), ops.strides[rank - 1])...);
    }
  }
}

template <typename A, typename B, typename Out, typename F>
void Map2(int num_shards, int64_t n, View a, View b, Out* out, const BroadcastPlan* plan, F f) {
  if (plan != nullptr) {
    return MapBroadcast<Out, F, A, B>(num_shards, *plan, out, f, MakeOperand<A>(a, *plan, 0),
                                      MakeOperand<B>(b, *plan, 1));
  }
  const A* pa = static_cast<const A*>(a.data);
  const B* pb = static_cast<const B*>(b.data);
  const int64_t total = num_shards * n;
  const int fa = FlatStride(a, n);
  const int fb = FlatStride(b, n);
  if (fa == 1 && fb == 1) {
    for (int64_t i = 0; i < total; ++i) out[i] = f(pa[i], pb[i]);
    return;
  }
  if (fa == 1 && fb == 0) {
    const B y = pb[0];
    for (int64_t i = 0; i < total; ++i) out[i] = f(pa[i], y);
    return;
  }
  if (fa == 0 && fb == 1) {
    const A x = pa[0];
    for (int64_t i = 0; i < total; ++i) out[i] = f(x, pb[i]);
    return;
  }
  // A per-shard scalar against a full operand, or a non-scalar constant:
  // shards outside, elements inside.
  for (int s = 0; s < num_shards; ++s) {
    const A* ra = pa + s * a.shard_stride;
    const B* rb = pb + s * b.shard_stride;
    Out* ro = out + s * n;
    if (a.elem_stride != 0 && b.elem_stride != 0) {
      for (int64_t j = 0; j < n; ++j) ro[j] = f(ra[j], rb[j]);
    } else if (a.elem_stride != 0) {
      const B y = rb[0];
      for (int64_t j = 0; j < n; ++j) ro[j] = f(ra[j], y);
    } else if (b.elem_stride != 0) {
      const A x = ra[0];
      for (int64_t j = 0; j < n; ++j) ro[j] = f(x, rb[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) ro[j] = f(ra[0], rb[0]);
    }
  }
}

// where(c, x, y).
template <typename T>
void Select(int num_shards, int64_t n, View c, View x, View y, T* out,
            const BroadcastPlan* plan) {
  auto f = [](bool p, T a, T b) { return p ? a : b; };
  if (plan != nullptr) {
    return MapBroadcast<T, decltype(f), bool, T, T>(
        num_shards, *plan, out, f, MakeOperand<bool>(c, *plan, 0), MakeOperand<T>(x, *plan, 1),
        MakeOperand<T>(y, *plan, 2));
  }
  const bool* pc = static_cast<const bool*>(c.data);
  const T* px = static_cast<const T*>(x.data);
  const T* py = static_cast<const T*>(y.data);
  for (int s = 0; s < num_shards; ++s) {
    const bool* rc = pc + s * c.shard_stride;
    const T* rx = px + s * x.shard_stride;
    const T* ry = py + s * y.shard_stride;
    T* ro = out + s * n;
    for (int64_t j = 0; j < n; ++j) {
      ro[j] = f(rc[j * c.elem_stride], rx[j * x.elem_stride], ry[j * y.elem_stride]);
    }
  }
}

// Sums shards in order 0..num_shards-1 into shard 0 of `out` (row by row, so
// the reads stay sequential), then replicates shard 0 to the other shards.
template <typename T>
void Psum(int num_shards, int64_t n, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) out[j] = px[j * x.elem_stride];
  for (int s = 1; s < num_shards; ++s) {
    const T* rx = px + s * x.shard_stride;
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (std::is_same_v<T, int32_t>) {  // wraps like numpy, not UB
        out[j] = static_cast<int32_t>(static_cast<uint32_t>(out[j]) +
                                      static_cast<uint32_t>(rx[j * x.elem_stride]));
      } else if constexpr (std::is_same_v<T, bool>) {
        out[j] = out[j] || rx[j * x.elem_stride];
      } else {
        out[j] += rx[j * x.elem_stride];
      }
    }
  }
  if (n == 1) {  // a scalar all-reduce: one fill, not a memcpy call per shard
    std::fill(out + 1, out + num_shards, out[0]);
    return;
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

// all_gather: out shard s = concat over source shards t at the gather axis.
// `outer` elements before the axis, `inner` after (per source shard).
template <typename T>
void AllGather(int num_shards, int64_t outer, int64_t inner, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  const int64_t n = outer * num_shards * inner;
  for (int64_t o = 0; o < outer; ++o) {
    for (int t = 0; t < num_shards; ++t) {
      T* dst = out + (o * num_shards + t) * inner;
      const T* src = px + t * x.shard_stride + o * inner * x.elem_stride;
      for (int64_t j = 0; j < inner; ++j) dst[j] = src[j * x.elem_stride];
    }
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

// ppermute: out shard d = x shard source[d], or zeros.
template <typename T>
void Ppermute(int num_shards, int64_t n, View x, const std::vector<int64_t>& source, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int d = 0; d < num_shards; ++d) {
    T* dst = out + d * n;
    const int64_t src = d < static_cast<int>(source.size()) ? source[d] : -1;
    if (src < 0) {
      std::fill(dst, dst + n, T(0));
      continue;
    }
    const T* rx = px + src * x.shard_stride;
    for (int64_t j = 0; j < n; ++j) dst[j] = rx[j * x.elem_stride];
  }
}

// int32 arithmetic wraps around (two's complement), as numpy's does.
inline int32_t Wrap(uint32_t v) { return static_cast<int32_t>(v); }

inline int32_t IntPow(int32_t base, int32_t exp) {
  if (exp < 0) {  // numpy raises; we cannot at run time, so follow JAX
    if (base == 1) return 1;
    if (base == -1) return (exp % 2 == 0) ? 1 : -1;
    return 0;
  }
  uint32_t result = 1;
  uint32_t b = static_cast<uint32_t>(base);
  while (exp > 0) {
    if (exp & 1) result *= b;
    b *= b;
    exp >>= 1;
  }
  return Wrap(result);
}

// NaN-propagating, as numpy.maximum / numpy.minimum.
template <typename T>
T Max(T x, T y) {
  return (x != x || x > y) ? x : y;  // NOLINT(misc-redundant-expression): NaN check
}
template <typename T>
T Min(T x, T y) {
  return (x != x || x < y) ? x : y;  // NOLINT(misc-redundant-expression): NaN check
}

// The offset of row-major element `i` of `dims` in a layout of `strides`.
inline int64_t Offset(int64_t i, const Dims& dims, const Dims& strides) {
  int64_t off = 0;
  for (size_t d = dims.size(); d-- > 0;) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

template <typename T>
T ReduceAdd(T a, T b) {
  if constexpr (std::is_same_v<T, int32_t>) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  } else if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else {
    return a + b;
  }
}

// A constant's bytes. An empty constant's vector has no storage (data() may
// be null); kernels offset pointers even when they read nothing, so it gets a
// real address.
const void* LiteralData(const Op& op) {
  static constexpr uint64_t kNoElements[1] = {0};
  return op.literal.empty() ? static_cast<const void*>(kNoElements) : op.literal.data();
}

// numpy's sum/mean/max/min/argmax over the plan's reduced dims, per shard.
template <typename T>
void Reduce(ReduceKind kind, int num_shards, int64_t n, const View& x,
            const FunctionExecutable::ReducePlan& plan, void* out_ptr) {
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

// pmean / pmax / pmin: reduce the shards in order into shard 0, then
// replicate. pmean divides the sum (in double) by num_shards and truncates
// toward zero for int32.
template <typename T>
void Pcollective(OpKind kind, int num_shards, int64_t n, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) {
    if (kind == OpKind::kPmean) {
      if constexpr (!std::is_same_v<T, bool>) {
        double acc = 0;
        for (int s = 0; s < num_shards; ++s) {
          acc += static_cast<double>(px[s * x.shard_stride + j * x.elem_stride]);
        }
        out[j] = static_cast<T>(acc / num_shards);
      }
      continue;
    }
    T acc = px[j * x.elem_stride];
    for (int s = 1; s < num_shards; ++s) {
      const T v = px[s * x.shard_stride + j * x.elem_stride];
      acc = kind == OpKind::kPmax ? Max(acc, v) : Min(acc, v);
    }
    out[j] = acc;
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

// Arithmetic, max and min: operands and result of type T.
template <typename T>
void RunArithmetic(OpKind kind, int num_shards, int64_t n, View a, View b, void* out,
                   const BroadcastPlan* plan) {
  T* o = static_cast<T*>(out);
  auto map = [&](auto f) { Map2<T, T, T>(num_shards, n, a, b, o, plan, f); };
  constexpr bool kInt = std::is_same_v<T, int32_t>;
  constexpr bool kBool = std::is_same_v<T, bool>;
  switch (kind) {
    case OpKind::kAdd:
      if constexpr (kInt) return map([](T x, T y) { return Wrap(uint32_t(x) + uint32_t(y)); });
      if constexpr (kBool) return map([](T x, T y) { return x || y; });
      if constexpr (!kInt && !kBool) return map([](T x, T y) { return x + y; });
      return;
    case OpKind::kSub:
      if constexpr (kInt) return map([](T x, T y) { return Wrap(uint32_t(x) - uint32_t(y)); });
      if constexpr (!kInt && !kBool) return map([](T x, T y) { return x - y; });
      return;  // bool: rejected by the builder
    case OpKind::kMul:
      if constexpr (kInt) return map([](T x, T y) { return Wrap(uint32_t(x) * uint32_t(y)); });
      if constexpr (kBool) return map([](T x, T y) { return x && y; });
      if constexpr (!kInt && !kBool) return map([](T x, T y) { return x * y; });
      return;
    case OpKind::kDiv:
      if constexpr (std::is_floating_point_v<T>) return map([](T x, T y) { return x / y; });
      return;  // integers divide in float64 (the builder converts)
    case OpKind::kPow:
      if constexpr (kInt) return map([](T x, T y) { return IntPow(x, y); });
      if constexpr (std::is_floating_point_v<T>) {
        return map([](T x, T y) { return static_cast<T>(std::pow(x, y)); });
      }
      return;
    case OpKind::kMax:
      return map([](T x, T y) { return Max(x, y); });
    case OpKind::kMin:
      return map([](T x, T y) { return Min(x, y); });
    case OpKind::kAnd:
      if constexpr (kBool) return map([](T x, T y) { return x && y; });
      return;
    case OpKind::kOr:
      if constexpr (kBool) return map([](T x, T y) { return x || y; });
      return;
    case OpKind::kXor:
      if constexpr (kBool) return map([](T x, T y) { return x != y; });
      return;
    default:
      return;
  }
}

// Comparisons: operands of type T, bool result.
template <typename T>
void RunComparison(OpKind kind, int num_shards, int64_t n, View a, View b, void* out,
                   const BroadcastPlan* plan) {
  bool* o = static_cast<bool*>(out);
  auto map = [&](auto f) { Map2<T, T, bool>(num_shards, n, a, b, o, plan, f); };
  switch (kind) {
    case OpKind::kEq:
      return map([](T x, T y) { return x == y; });
    case OpKind::kNe:
      return map([](T x, T y) { return x != y; });
    case OpKind::kLt:
      return map([](T x, T y) { return x < y; });
    case OpKind::kLe:
      return map([](T x, T y) { return x <= y; });
    case OpKind::kGt:
      return map([](T x, T y) { return x > y; });
    case OpKind::kGe:
      return map([](T x, T y) { return x >= y; });
    default:
      return;
  }
}

template <typename T>
void RunUnary(OpKind kind, int num_shards, int64_t n, View x, void* out) {
  T* o = static_cast<T*>(out);
  auto map = [&](auto f) { Map1<T>(num_shards, n, x, o, f); };
  constexpr bool kFloat = std::is_floating_point_v<T>;
  switch (kind) {
    case OpKind::kNeg:
      if constexpr (std::is_same_v<T, int32_t>) return map([](T v) { return Wrap(0u - uint32_t(v)); });
      if constexpr (kFloat) return map([](T v) { return -v; });
      return;
    case OpKind::kAbs:
      if constexpr (std::is_same_v<T, int32_t>) {
        return map([](T v) { return v < 0 ? Wrap(0u - uint32_t(v)) : v; });
      }
      if constexpr (kFloat) return map([](T v) { return std::abs(v); });
      return map([](T v) { return v; });
    case OpKind::kNot:
      if constexpr (std::is_same_v<T, bool>) return map([](T v) { return !v; });
      return;
    case OpKind::kSimulatedCompute:  // the time is spent by the executor, not here
      return map([](T v) { return v; });
    default:
      break;
  }
  if constexpr (kFloat) {  // transcendental: the builder converts to float
    switch (kind) {
      case OpKind::kExp:
        return map([](T v) { return std::exp(v); });
      case OpKind::kLog:
        return map([](T v) { return std::log(v); });
      case OpKind::kTanh:
        return map([](T v) { return std::tanh(v); });
      case OpKind::kSqrt:
        return map([](T v) { return std::sqrt(v); });
      case OpKind::kRsqrt:
        return map([](T v) { return T(1) / std::sqrt(v); });
      case OpKind::kSin:
        return map([](T v) { return std::sin(v); });
      case OpKind::kCos:
        return map([](T v) { return std::cos(v); });
      default:
        return;
    }
  }
}

template <typename Out, typename In>
Out ConvertElement(In v) {
  if constexpr (std::is_same_v<Out, bool>) {
    return v != In(0);
  } else if constexpr (std::is_same_v<Out, int32_t> && std::is_floating_point_v<In>) {
    // Out-of-range and NaN are undefined in C++; give INT32_MIN as x86 numpy does.
    if (!(v >= In(-2147483648.0) && v < In(2147483648.0))) {
      return std::numeric_limits<int32_t>::min();
    }
    return static_cast<int32_t>(v);
  } else {
    return static_cast<Out>(v);
  }
}

// Calls f with a null pointer of the element type of `dtype`.
template <typename F>
void DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF64:
      return f(static_cast<double*>(nullptr));
    case DType::kI32:
      return f(static_cast<int32_t*>(nullptr));
    case DType::kBool:
      return f(static_cast<bool*>(nullptr));
    case DType::kF32:
      return f(static_cast<float*>(nullptr));
  }
}

template <typename In>
void RunConvert(DType to, int num_shards, int64_t n, View x, void* out) {
  DispatchDType(to, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    Map1<In>(num_shards, n, x, static_cast<Out*>(out),
             [](In v) { return ConvertElement<Out, In>(v); });
  });
}

// The kernels' view of the op registry (op_registry.h).
// Elementwise binary ops whose result has the operands' (promoted) type.
bool IsBinaryKind(OpKind kind) {
  return IsBinaryOp(kind) && GetTypeRule(kind) != TypeRule::kComparison;
}

bool IsComparisonKind(OpKind kind) { return GetTypeRule(kind) == TypeRule::kComparison; }

// simulated_compute runs as a unary identity (its time is the executor's).
bool IsUnaryKind(OpKind kind) { return IsUnaryOp(kind) || GetOpClass(kind) == OpClass::kSimulated; }

// Runs a kConvert, unary, binary, comparison or select op (operands x, y, z
// as the op has them).
void RunElementwise(const Op& op, DType in_dtype, int num_shards, int64_t n, View x, View y,
                    View z, void* out, const BroadcastPlan* plan) {
  if (op.kind == OpKind::kConvert) {
    DispatchDType(in_dtype, [&](auto* tag) {
      using In = std::remove_pointer_t<decltype(tag)>;
      RunConvert<In>(op.type.dtype, num_shards, n, x, out);
    });
  } else if (IsBinaryKind(op.kind)) {
    DispatchDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      RunArithmetic<T>(op.kind, num_shards, n, x, y, out, plan);
    });
  } else if (IsComparisonKind(op.kind)) {
    DispatchDType(in_dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      RunComparison<T>(op.kind, num_shards, n, x, y, out, plan);
    });
  } else if (IsUnaryKind(op.kind)) {
    DispatchDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      RunUnary<T>(op.kind, num_shards, n, x, out);
    });
  } else if (op.kind == OpKind::kSelect) {
    DispatchDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      Select<T>(num_shards, n, x, y, z, static_cast<T*>(out), plan);
    });
  }
}

bool IsElementwiseKind(OpKind kind) {
  return GetOpClass(kind) == OpClass::kElementwise || GetOpClass(kind) == OpClass::kSimulated;
}

// Ops run by copy plans (data_movement.h): all_to_all is one within the gang.
bool IsDataMovementKind(OpKind kind) {
  return GetOpClass(kind) == OpClass::kDataMovement || kind == OpKind::kAllToAll;
}

// Ops whose result on one shard depends on other shards or on the shard's
// position in the gang. Every other op computes each shard from that shard's
// operands alone (nothing is random or position-based), so RunLocal runs
// them on the local shards as they are.
bool IsCrossShardKind(OpKind kind) { return IsCollectiveOp(kind); }

// How RunLocal reduces a cross-shard op's local results across hosts when
// the op is a reduction (psum, pmean, pmax, pmin), else nothing: the op
// gathers its operand instead. psum of bool is a logical or (see Psum).
std::optional<ReduceOp> HostReduction(OpKind kind, DType dtype) {
  switch (kind) {
    case OpKind::kPsum:
      return dtype == DType::kBool ? ReduceOp::kMax : ReduceOp::kSum;
    case OpKind::kPmean:
      return ReduceOp::kSum;  // of float64 sums
    case OpKind::kPmax:
      return ReduceOp::kMax;
    case OpKind::kPmin:
      return ReduceOp::kMin;
    default:
      return std::nullopt;
  }
}

// pmean on a partial gang, before and after the hosts' AllReduce: `sums`
// gets this host's float64 sums of its shards (in order) of `x`; then `out`
// (one shard) gets the gang's sums divided by `gang_size`, as Pcollective.
template <typename T>
void LocalMeanSums(int num_shards, int64_t n, View x, double* sums) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int s = 0; s < num_shards; ++s) acc += static_cast<double>(px[s * x.shard_stride + j * x.elem_stride]);
    sums[j] = acc;
  }
}
template <typename T>
void MeanFromSums(int gang_size, int64_t n, const double* sums, T* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(sums[j] / gang_size);
}

// The transpose of take for one shard: out [outer, dim, inner] is zeroed,
// then updates [outer, num_indices, inner] are added at the clipped indices.
template <typename T>
void ScatterAddRows(int64_t outer, int64_t dim, int64_t inner, const T* updates,
                    const int32_t* indices, int64_t num_indices, int64_t index_stride, T* out) {
  std::fill(out, out + outer * dim * inner, T(0));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < num_indices; ++j) {
      T* dst = out + (o * dim + ClipIndex(indices[j * index_stride], dim)) * inner;
      const T* src = updates + (o * num_indices + j) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = ReduceAdd(dst[i], src[i]);
    }
  }
}

// psum_scatter: shard d of `out` is the sum over shards s (in order) of
// x_s[o, d, i] for x_s of [outer, num_shards, inner].
template <typename T>
void PsumScatter(int num_shards, int64_t outer, int64_t inner, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  const int64_t n = outer * inner;
  for (int d = 0; d < num_shards; ++d) {
    T* od = out + d * n;
    for (int s = 0; s < num_shards; ++s) {
      const T* xs = px + s * x.shard_stride;
      for (int64_t o = 0; o < outer; ++o) {
        const T* src = xs + (o * num_shards + d) * inner;
        T* dst = od + o * inner;
        if (s == 0) {
          std::copy(src, src + inner, dst);
        } else {
          for (int64_t i = 0; i < inner; ++i) dst[i] = ReduceAdd(dst[i], src[i]);
        }
      }
    }
  }
}

// Product of dims [begin, end).
int64_t DimProduct(const Dims& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end; ++d) p *= dims[d];
  return p;
}

// Runs cross-shard op `op` (not axis_index) over `num_shards` shards: the
// whole gang, whose operand is `x`. `in_dims` are the operand's dims;
// `all_to_all_plan` is the op's CopyPlan when it is an all_to_all.
void RunCrossShardKernel(const Op& op, const Dims& in_dims, const CopyPlan* all_to_all_plan,
                         int num_shards, const View& x, void* out) {
  const int64_t n = op.type.num_elements();
  if (op.kind == OpKind::kAllToAll) {
    const CopyPlan& p = *all_to_all_plan;
    const int64_t esize = DTypeSize(op.type.dtype);
    uint8_t* o = static_cast<uint8_t*>(out);
    for (int d = 0; d < num_shards; ++d) {
      for (int s = 0; s < num_shards; ++s) {
        const auto* src = static_cast<const uint8_t*>(x.data) +
                          (s * x.shard_stride + d * p.src_shard_step) * esize;
        StridedCopy(p, esize, src, o + (d * n + s * p.dst_shard_step) * esize);
      }
    }
    return;
  }
  DispatchDType(op.type.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* o = static_cast<T*>(out);
    switch (op.kind) {
      case OpKind::kPsum:
        return Psum<T>(num_shards, n, x, o);
      case OpKind::kPmean:
      case OpKind::kPmax:
      case OpKind::kPmin:
        return Pcollective<T>(op.kind, num_shards, n, x, o);
      case OpKind::kAllGather: {
        const size_t a = static_cast<size_t>(op.axis);
        return AllGather<T>(num_shards, DimProduct(in_dims, 0, a),
                            DimProduct(in_dims, a, in_dims.size()), x, o);
      }
      case OpKind::kPpermute:
        return Ppermute<T>(num_shards, n, x, op.perm_source, o);
      case OpKind::kPsumScatter: {
        const size_t a = static_cast<size_t>(op.axis);
        return PsumScatter<T>(num_shards, DimProduct(in_dims, 0, a),
                              DimProduct(in_dims, a + 1, in_dims.size()), x, o);
      }
      default:
        return;
    }
  });
}

// Whether Run() has a kernel for ops of `kind`: every op of the registry
// (each class has its kernels; elementwise ones switch over every kind of
// their rule), so only a value outside the enum has none.
bool HasKernel(OpKind kind) { return static_cast<int>(kind) < kNumOpKinds; }

}  // namespace

absl::StatusOr<std::shared_ptr<const FunctionExecutable>> FunctionExecutable::Compile(
    std::shared_ptr<const FunctionIr> ir) {
  if (ir == nullptr) return absl::InvalidArgumentError("compile: null function");
  const absl::Span<const Op> ops = ir->ops();
  const int32_t num_ops = static_cast<int32_t>(ops.size());

  // Last op that reads each value; outputs stay live past the last op.
  std::vector<int32_t> last_use(num_ops);
  for (int32_t i = 0; i < num_ops; ++i) {
    last_use[i] = i;
    if (!HasKernel(ops[i].kind)) {
      return absl::UnimplementedError(
          absl::StrCat("compile: @", ir->name(), ": op %", i, " has kind ",
                       static_cast<int>(ops[i].kind), ", which the kernels cannot run"));
    }
    for (int32_t v : ops[i].operands) last_use[v] = i;
  }
  for (int32_t v : ir->outputs()) last_use[v] = num_ops;

  auto exe = std::shared_ptr<FunctionExecutable>(new FunctionExecutable(ir));

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

  // Parameters are read in place and constants straight from their literal;
  // every other value gets a scratch slot, except values internal to a fusion
  // group. First fit over the slots of values still live at its definition,
  // so dead intermediates are reused. A value never shares a slot with its
  // operands (they are live at its definition).
  exe->scratch_offset_.assign(num_ops, -1);
  struct Slot {
    int64_t offset;
    int64_t size;
  };
  std::vector<Slot> live;
  for (int32_t v = 0; v < num_ops; ++v) {
    const OpKind kind = ops[v].kind;
    if (kind == OpKind::kParameter || kind == OpKind::kConstant || exe->tile_offset_[v] >= 0) {
      continue;
    }
    const int64_t size = RoundUp(ops[v].type.num_bytes());
    live.clear();
    for (int32_t u = 0; u < v; ++u) {
      if (exe->scratch_offset_[u] >= 0 && last_use[u] >= v) {
        live.push_back({exe->scratch_offset_[u], RoundUp(ops[u].type.num_bytes())});
      }
    }
    std::sort(live.begin(), live.end(),
              [](const Slot& a, const Slot& b) { return a.offset < b.offset; });
    int64_t offset = 0;
    for (const Slot& s : live) {
      if (offset + size <= s.offset) break;
      offset = std::max(offset, s.offset + s.size);
    }
    exe->scratch_offset_[v] = offset;
    exe->scratch_per_shard_ = std::max(exe->scratch_per_shard_, offset + size);
  }

  // RunLocal's full-gang temporaries (see gang_temp_per_shard_) and its
  // first call to its collectives. axis_index reads no operand and writes
  // the local shards directly.
  for (int32_t v = 0; v < num_ops; ++v) {
    const Op& op = ops[v];
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
    const Dims& in = ops[op.operands[0]].type.dims;
    ReducePlan plan;
    int64_t stride = 1;
    Dims strides(in.size(), 0);
    for (size_t d = in.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= in[d];
    }
    size_t k = 0;
    for (size_t d = 0; d < in.size(); ++d) {
      if (k < op.axes.size() && op.axes[k] == static_cast<int64_t>(d)) {
        plan.red_dims.push_back(in[d]);
        plan.red_strides.push_back(strides[d]);
        plan.red_count *= in[d];
        ++k;
      } else {
        plan.kept_dims.push_back(in[d]);
        plan.kept_strides.push_back(strides[d]);
      }
    }
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
      exe->matmul_plans_.push_back(MakeMatmulPlan(ops[op.operands[0]].type.dims,
                                                  ops[op.operands[1]].type.dims));
    }
  }
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
  RunShards(num_shards, nullptr, nullptr, inputs, outputs, scratch).IgnoreError();
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
  return RunShards(local.num_local(), &local, collectives, inputs, outputs, scratch);
}

absl::Status FunctionExecutable::RunShards(int num_shards, const LocalShards* local,
                                           GangCollectives* collectives,
                                           absl::Span<const void* const> inputs,
                                           absl::Span<void* const> outputs, void* scratch) const {
  const absl::Span<const Op> ops = ir_->ops();
  uint8_t* const base = static_cast<uint8_t*>(scratch);

  auto view = [&](int32_t v) -> View {
    const Op& op = ops[v];
    const int64_t n = op.type.num_elements();
    const int64_t elem_stride = op.type.dims.empty() ? 0 : 1;
    switch (op.kind) {
      case OpKind::kParameter:
        return {inputs[op.param_index], n, elem_stride};
      case OpKind::kConstant:
        return {LiteralData(op), 0, elem_stride};
      default:
        return {base + scratch_offset_[v] * num_shards, n, elem_stride};
    }
  };

  uint8_t* const tiles = base + scratch_per_shard_ * num_shards;
  uint8_t* const gang_temp = tiles + tile_bytes_;  // RunLocal on a partial gang only
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::kParameter || op.kind == OpKind::kConstant) continue;
    if (group_start_[i] >= 0) {  // a fused run, tile by tile over the whole gang
      const FusionGroup& g = groups_[static_cast<size_t>(group_start_[i])];
      const int64_t total = op.type.num_elements() * num_shards;
      for (int64_t t0 = 0; t0 < total; t0 += kTileElements) {
        const int64_t len = std::min(kTileElements, total - t0);
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
                        : static_cast<void*>(base + scratch_offset_[v] * num_shards +
                                             t0 * DTypeSize(fop.type.dtype));
          RunElementwise(fop, ops[fop.operands[0]].type.dtype, 1, len, x, y, z, o, nullptr);
        }
      }
      i = static_cast<size_t>(g.last);
      continue;
    }
    void* out = base + scratch_offset_[i] * num_shards;
    const int64_t n = op.type.num_elements();
    if (op.kind == OpKind::kAxisIndex) {
      int32_t* o = static_cast<int32_t*>(out);
      if (local == nullptr) {
        for (int s = 0; s < num_shards; ++s) o[s] = s;
      } else {
        for (int s = 0; s < num_shards; ++s) o[s] = local->positions()[s];
      }
      continue;
    }
    const View x = view(op.operands[0]);
    if (IsCrossShardKind(op.kind)) {
      auto run_cross_shard = [&](int shards, const View& in, void* result) {
        const auto [first, count] = copy_range_[i];
        RunCrossShardKernel(op, ops[op.operands[0]].type.dims,
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
          DispatchDType(op.type.dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            LocalMeanSums<T>(num_shards, n, x, sums);
          });
          PW_RETURN_IF_ERROR(collectives->AllReduce(DType::kF64, ReduceOp::kSum, sums, n));
          DispatchDType(op.type.dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            MeanFromSums<T>(gang, n, sums, static_cast<T*>(out));
          });
        } else {
          RunCrossShardKernel(op, ops[op.operands[0]].type.dims, nullptr, num_shards, x, out);
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
      RunElementwise(op, in_dtype, num_shards, n, x, y, z, out, plan);
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
    } else if (op.kind == OpKind::kTake || op.kind == OpKind::kScatterAdd) {
      // x (take) or the result (scatter_add) is [outer, dim, inner] around op.axis.
      const View idx = view(op.operands[1]);
      const Dims& full = op.kind == OpKind::kTake ? ops[op.operands[0]].type.dims : op.type.dims;
      const size_t a = static_cast<size_t>(op.axis);
      const int64_t outer = DimProduct(full, 0, a);
      const int64_t dim = full[a];
      const int64_t inner = DimProduct(full, a + 1, full.size());
      const int64_t num_indices = ops[op.operands[1]].type.num_elements();
      const int64_t index_stride = idx.elem_stride;
      const int64_t esize = DTypeSize(op.type.dtype);
      for (int s = 0; s < num_shards; ++s) {
        const int32_t* is = static_cast<const int32_t*>(idx.data) + s * idx.shard_stride;
        if (op.kind == OpKind::kTake) {
          TakeRows(esize, outer, dim, inner,
                   static_cast<const uint8_t*>(x.data) + s * x.shard_stride * esize, is,
                   num_indices, index_stride, static_cast<uint8_t*>(out) + s * n * esize);
          continue;
        }
        DispatchDType(op.type.dtype, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          if constexpr (!std::is_same_v<T, bool>) {
            ScatterAddRows<T>(outer, dim, inner, static_cast<const T*>(x.data) + s * x.shard_stride,
                              is, num_indices, index_stride, static_cast<T*>(out) + s * n);
          }
        });
      }
    } else if (op.kind == OpKind::kMatmul) {
      const MatmulPlan& mp = matmul_plans_[static_cast<size_t>(matmul_index_[i])];
      const View y = view(op.operands[1]);
      const int64_t esize = DTypeSize(op.type.dtype);
      const int64_t batch = static_cast<int64_t>(mp.a_offsets.size());
      for (int s = 0; s < num_shards; ++s) {
        BatchedMatmul(op.type.dtype, false, false, mp.m, mp.n, mp.k, batch,
                      static_cast<const uint8_t*>(x.data) + s * x.shard_stride * esize,
                      mp.a_offsets.data(),
                      static_cast<const uint8_t*>(y.data) + s * y.shard_stride * esize,
                      mp.b_offsets.data(), static_cast<uint8_t*>(out) + s * n * esize);
      }
    } else if (op.kind == OpKind::kReduce) {
      const ReducePlan& rp = reduce_plans_[static_cast<size_t>(reduce_index_[i])];
      DispatchDType(in_dtype, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        Reduce<T>(op.reduce_kind, num_shards, n, x, rp, out);
      });
    }
  }

  for (int i = 0; i < ir_->num_outputs(); ++i) {
    const int32_t v = ir_->outputs()[i];
    const View src = view(v);
    const int64_t bytes = ops[v].type.num_bytes();
    if (bytes == 0) continue;
    uint8_t* dst = static_cast<uint8_t*>(outputs[i]);
    if (src.shard_stride != 0) {
      std::memcpy(dst, src.data, bytes * num_shards);
    } else {  // a constant: every shard gets the literal
      for (int s = 0; s < num_shards; ++s) std::memcpy(dst + s * bytes, src.data, bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace pw
