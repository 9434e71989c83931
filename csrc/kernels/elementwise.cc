#include "csrc/kernels/elementwise.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "csrc/kernels/vector_math.h"

namespace pw::kernels {
namespace {

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

// One row of a two-operand broadcast, each operand's last-dimension stride
// 1 or 0: a loop per case, so the compiler vectorizes the common ones.
template <typename Out, typename F, typename A, typename B>
void BroadcastRow(Out* ro, int64_t last, F& f, std::pair<const A*, int64_t> a,
                  std::pair<const B*, int64_t> b) {
  const A* pa = a.first;
  const B* pb = b.first;
  if (a.second == 1 && b.second == 1) {
    for (int64_t t = 0; t < last; ++t) ro[t] = f(pa[t], pb[t]);
  } else if (a.second == 1 && b.second == 0) {
    const B y = pb[0];
    for (int64_t t = 0; t < last; ++t) ro[t] = f(pa[t], y);
  } else if (a.second == 0 && b.second == 1) {
    const A x = pa[0];
    for (int64_t t = 0; t < last; ++t) ro[t] = f(x, pb[t]);
  } else {
    for (int64_t t = 0; t < last; ++t) ro[t] = f(pa[t * a.second], pb[t * b.second]);
  }
}

// The general numpy-broadcasting loop: rows of the last dimension; each
// operand's row start follows the row index like an odometer over the
// leading dims (no division per row).
template <typename Out, typename F, typename... In, size_t... I>
void MapBroadcastImpl(std::index_sequence<I...>, int num_shards, const BroadcastPlan& plan,
                      Out* out, F f, Operand<In>... ops) {
  const size_t rank = plan.dims.size();
  const int64_t n = NumElements(plan.dims);
  if (n == 0) return;
  const int64_t last = plan.dims[rank - 1];
  const int64_t rows = n / last;
  constexpr size_t kOps = sizeof...(In);
  const int64_t* strides[kOps] = {ops.strides...};
  for (int s = 0; s < num_shards; ++s) {
    const int64_t shard_start[kOps] = {s * ops.shard_stride...};
    int64_t start[kOps];
    for (size_t k = 0; k < kOps; ++k) start[k] = shard_start[k];
    absl::InlinedVector<int64_t, 6> index(rank, 0);  // over dims [0, rank-1)
    for (int64_t r = 0; r < rows; ++r) {
      BroadcastRow<Out, F, In...>(
          out + s * n + r * last, last, f,
          std::pair<const In*, int64_t>(ops.p + start[I], ops.strides[rank - 1])...);
      // Next row: advance the odometer from the innermost leading dim.
      for (size_t d = rank - 1; d-- > 0;) {
        if (++index[d] < plan.dims[d]) {
          for (size_t j = 0; j < kOps; ++j) start[j] += strides[j][d];
          break;
        }
        index[d] = 0;
        for (size_t j = 0; j < kOps; ++j) start[j] -= strides[j][d] * (plan.dims[d] - 1);
      }
    }
  }
}

template <typename Out, typename F, typename... In>
void MapBroadcast(int num_shards, const BroadcastPlan& plan, Out* out, F f,
                  Operand<In>... ops) {
  MapBroadcastImpl<Out, F, In...>(std::index_sequence_for<In...>{}, num_shards, plan, out, f,
                                  ops...);
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

// Arithmetic, max, min, bitwise ops and shifts: operands and result of type T.
template <typename T>
void RunArithmetic(OpKind kind, int num_shards, int64_t n, View a, View b, void* out,
                   const BroadcastPlan* plan) {
  T* o = static_cast<T*>(out);
  auto map = [&](auto f) { Map2<T, T, T>(num_shards, n, a, b, o, plan, f); };
  constexpr bool kInt = std::is_same_v<T, int32_t>;
  constexpr bool kUint = std::is_same_v<T, uint32_t>;  // wraps by itself
  constexpr bool kBool = std::is_same_v<T, bool>;
  constexpr bool kFloat = std::is_floating_point_v<T>;
  switch (kind) {
    case OpKind::kAdd:
      return map([](T x, T y) { return ScalarAdd(x, y); });
      return;
    case OpKind::kSub:
      if constexpr (!kBool) return map([](T x, T y) { return ScalarSub(x, y); });
      return;  // bool: rejected by the builder
    case OpKind::kMul:
      return map([](T x, T y) { return ScalarMul(x, y); });
      return;
    case OpKind::kDiv:
      if constexpr (kFloat) return map([](T x, T y) { return ScalarDiv(x, y); });
      return;  // integers divide in float64 (the builder converts)
    case OpKind::kPow:
      if constexpr (!kBool) return map([](T x, T y) { return ScalarPow(x, y); });
      return;
    case OpKind::kRem:
      if constexpr (!kBool) return map([](T x, T y) { return ScalarRem(x, y); });
      return;  // bool computes in int32 (the builder converts)
    case OpKind::kAtan2:
      if constexpr (kFloat) {
        return map([](T y, T x) { return ScalarAtan2(y, x); });
      }
      return;  // integers and bool: converted by the builder
    case OpKind::kMax:
      return map([](T x, T y) { return Max(x, y); });
    case OpKind::kMin:
      return map([](T x, T y) { return Min(x, y); });
    case OpKind::kAnd:
      if constexpr (kBool) return map([](T x, T y) { return x && y; });
      if constexpr (kInt || kUint) return map([](T x, T y) { return T(x & y); });
      return;
    case OpKind::kOr:
      if constexpr (kBool) return map([](T x, T y) { return x || y; });
      if constexpr (kInt || kUint) return map([](T x, T y) { return T(x | y); });
      return;
    case OpKind::kXor:
      if constexpr (kBool) return map([](T x, T y) { return x != y; });
      if constexpr (kInt || kUint) return map([](T x, T y) { return T(x ^ y); });
      return;
    case OpKind::kShiftLeft:
      if constexpr (kInt || kUint) return map([](T x, T y) { return ShiftLeft(x, y); });
      return;  // bool and floats: rejected or converted by the builder
    case OpKind::kShiftRightLogical:
      if constexpr (kInt || kUint) return map([](T x, T y) { return ShiftRightLogical(x, y); });
      return;
    case OpKind::kShiftRightArithmetic:
      if constexpr (kInt || kUint) return map([](T x, T y) { return ShiftRightArithmetic(x, y); });
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

// y = fn(x) elementwise, fn one of vector_math.h's array functions: one
// call over the gang when x is contiguous, else per shard (a broadcast
// scalar computed once, through fn too, so every path gives the same bits).
template <typename T>
void MapArray(int num_shards, int64_t n, View x, T* out, void (*fn)(const T*, T*, int64_t)) {
  const T* px = static_cast<const T*>(x.data);
  switch (FlatStride(x, n)) {
    case 1:
      return fn(px, out, num_shards * n);
    case 0: {
      T v;
      fn(px, &v, 1);
      std::fill(out, out + num_shards * n, v);
      return;
    }
    default:
      for (int s = 0; s < num_shards; ++s) {
        const T* rx = px + s * x.shard_stride;
        T* ro = out + s * n;
        if (x.elem_stride == 1) {
          fn(rx, ro, n);
        } else {  // elem_stride 0: one value per shard
          T v;
          fn(rx, &v, 1);
          std::fill(ro, ro + n, v);
        }
      }
  }
}

template <typename T>
void RunUnary(OpKind kind, int num_shards, int64_t n, View x, void* out) {
  T* o = static_cast<T*>(out);
  auto map = [&](auto f) { Map1<T>(num_shards, n, x, o, f); };
  constexpr bool kFloat = std::is_floating_point_v<T>;
  switch (kind) {
    case OpKind::kNeg:
      if constexpr (!std::is_same_v<T, bool>) return map([](T v) { return ScalarNeg(v); });
      return;
    case OpKind::kAbs:
      return map([](T v) { return ScalarAbs(v); });
    case OpKind::kNot:
      if constexpr (std::is_same_v<T, bool>) return map([](T v) { return !v; });
      if constexpr (std::is_integral_v<T>) return map([](T v) { return T(~v); });
      return;
    case OpKind::kSimulatedCompute:  // the time is spent by the executor, not here
      return map([](T v) { return v; });
    default:
      break;
  }
  if constexpr (kFloat) {
    // C's functions in double (glibc's: within 1 ulp), a float result rounded
    // once from them.
    double (*libm)(double) = nullptr;
    switch (kind) {
      case OpKind::kTan: libm = [](double v) { return std::tan(v); }; break;
      case OpKind::kAsin: libm = [](double v) { return std::asin(v); }; break;
      case OpKind::kAcos: libm = [](double v) { return std::acos(v); }; break;
      case OpKind::kAtan: libm = [](double v) { return std::atan(v); }; break;
      case OpKind::kSinh: libm = [](double v) { return std::sinh(v); }; break;
      case OpKind::kCosh: libm = [](double v) { return std::cosh(v); }; break;
      case OpKind::kAsinh: libm = [](double v) { return std::asinh(v); }; break;
      case OpKind::kAcosh: libm = [](double v) { return std::acosh(v); }; break;
      case OpKind::kAtanh: libm = [](double v) { return std::atanh(v); }; break;
      default: break;
    }
    if (libm != nullptr) return map([libm](T v) { return static_cast<T>(libm(double{v})); });
  }
  if constexpr (kFloat) {  // transcendental: the builder converts to float
    void (*fn)(const T*, T*, int64_t) = nullptr;
    switch (kind) {
      case OpKind::kExp:
        fn = &Exp;
        break;
      case OpKind::kLog:
        fn = &Log;
        break;
      case OpKind::kTanh:
        fn = &Tanh;
        break;
      case OpKind::kSqrt:
        fn = &Sqrt;
        break;
      case OpKind::kRsqrt:
        fn = &Rsqrt;
        break;
      case OpKind::kSin:
        fn = &Sin;
        break;
      case OpKind::kCos:
        fn = &Cos;
        break;
      case OpKind::kErf:
        fn = &Erf;
        break;
      case OpKind::kErfc:
        fn = &Erfc;
        break;
      default:
        return;
    }
    MapArray<T>(num_shards, n, x, o, fn);
  }
}

template <typename Out, typename In>
Out ConvertElement(In v) {
  if constexpr (std::is_same_v<In, BFloat16>) {
    return ConvertElement<Out, float>(BFloat16ToFloat(v));  // exact
  } else if constexpr (std::is_same_v<Out, BFloat16>) {
    // Through float32, as ml_dtypes: float64 and large integers round twice.
    return FloatToBFloat16(static_cast<float>(v));
  } else {
    return ConvertScalar<Out, In>(v);
  }
}

// The bits of each element of x, of type In, as type Out of the same size.
template <typename In, typename Out>
void RunBitcast(int num_shards, int64_t n, View x, void* out) {
  static_assert(sizeof(In) == sizeof(Out));
  Map1<In>(num_shards, n, x, static_cast<Out*>(out), [](In v) { return std::bit_cast<Out>(v); });
}

template <typename In>
void RunConvert(DType to, int num_shards, int64_t n, View x, void* out) {
  DispatchStorageDType(to, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    Map1<In>(num_shards, n, x, static_cast<Out*>(out),
             [](In v) { return ConvertElement<Out, In>(v); });
  });
}

}  // namespace

bool IsBinaryKind(OpKind kind) {
  return IsBinaryOp(kind) && GetTypeRule(kind) != TypeRule::kComparison;
}

bool IsComparisonKind(OpKind kind) { return GetTypeRule(kind) == TypeRule::kComparison; }

bool IsUnaryKind(OpKind kind) { return IsUnaryOp(kind) || GetOpClass(kind) == OpClass::kSimulated; }

void RunElementwise(const Op& op, DType in_dtype, int num_shards, int64_t n, View x, View y,
                    View z, void* out, const BroadcastPlan* plan) {
  if (op.kind == OpKind::kConvert) {
    DispatchStorageDType(in_dtype, [&](auto* tag) {
      using In = std::remove_pointer_t<decltype(tag)>;
      RunConvert<In>(op.type.dtype, num_shards, n, x, out);
    });
  } else if (op.kind == OpKind::kBitcastConvert) {
    DispatchDType(in_dtype, [&](auto* in_tag) {
      using In = std::remove_pointer_t<decltype(in_tag)>;
      DispatchDType(op.type.dtype, [&](auto* out_tag) {
        using Out = std::remove_pointer_t<decltype(out_tag)>;
        if constexpr (sizeof(In) == sizeof(Out)) RunBitcast<In, Out>(num_shards, n, x, out);
      });
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
  } else if (op.kind == OpKind::kSimulatedCompute) {  // identity, of any dtype
    DispatchStorageDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      Map1<T>(num_shards, n, x, static_cast<T*>(out), [](T v) { return v; });
    });
  } else if (IsUnaryKind(op.kind)) {
    DispatchDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      RunUnary<T>(op.kind, num_shards, n, x, out);
    });
  } else if (op.kind == OpKind::kSelect) {
    DispatchStorageDType(op.type.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      Select<T>(num_shards, n, x, y, z, static_cast<T*>(out), plan);
    });
  }
}

bool IsElementwiseKind(OpKind kind) {
  return GetOpClass(kind) == OpClass::kElementwise || GetOpClass(kind) == OpClass::kSimulated;
}


}  // namespace pw::kernels
