#ifndef PATHWAYS_KERNELS_SCALAR_OPS_H_
#define PATHWAYS_KERNELS_SCALAR_OPS_H_

// The scalar semantics of the kernels: numpy's integer wrap-around and
// conversions, NaN-propagating max and min, and the order in which a row is
// summed. The interpreter's kernels (elementwise.cc, reduction.cc) and the
// native code generated for fused regions (csrc/codegen) both use these
// definitions: this header is compiled into the runtime and also embedded,
// as text, at the head of every generated source file, so the two give the
// same bits by construction. Hence it includes only the standard library
// and defines nothing but inline templates and functions.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace pw::kernels {

// int32 arithmetic wraps around (two's complement), as numpy's does.
inline int32_t Wrap(uint32_t v) { return static_cast<int32_t>(v); }

// base ** exp by squaring, wrapping modulo 2^32.
inline uint32_t UintPow(uint32_t base, uint32_t exp) {
  uint32_t result = 1;
  while (exp > 0) {
    if (exp & 1) result *= base;
    base *= base;
    exp >>= 1;
  }
  return result;
}

inline int32_t IntPow(int32_t base, int32_t exp) {
  if (exp < 0) {  // numpy raises; we cannot at run time, so follow JAX
    if (base == 1) return 1;
    if (base == -1) return (exp % 2 == 0) ? 1 : -1;
    return 0;
  }
  return Wrap(UintPow(static_cast<uint32_t>(base), static_cast<uint32_t>(exp)));
}

// Shifts of 32-bit integers with XLA's out-of-range counts: a count outside
// [0, 32) (a negative one taken as unsigned) shifts every bit out, giving 0,
// or for an arithmetic right shift the sign bit everywhere.
template <typename T>
T ShiftLeft(T x, T n) {
  return static_cast<uint32_t>(n) < 32u ? static_cast<T>(static_cast<uint32_t>(x) << n) : T(0);
}
template <typename T>
T ShiftRightLogical(T x, T n) {
  return static_cast<uint32_t>(n) < 32u ? static_cast<T>(static_cast<uint32_t>(x) >> n) : T(0);
}
template <typename T>
T ShiftRightArithmetic(T x, T n) {
  const int32_t v = static_cast<int32_t>(x);  // C++20: >> of a negative int is arithmetic
  return static_cast<T>(v >> (static_cast<uint32_t>(n) < 32u ? static_cast<uint32_t>(n) : 31u));
}

// float or double to int32 as numpy does on x86: truncated toward zero;
// NaN and out-of-range (undefined in C++) give INT32_MIN.
template <typename F>
int32_t ToInt32(F v) {
  if (!(v >= F(-2147483648.0) && v < F(2147483648.0))) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(v);
}

// float or double to uint32 as XLA does (numpy's is undefined out of range):
// truncated toward zero, saturating to [0, 2^32 - 1], NaN giving 0.
template <typename F>
uint32_t ToUint32(F v) {
  if (!(v > F(0))) return 0;
  if (v >= F(4294967295.0)) return std::numeric_limits<uint32_t>::max();
  return static_cast<uint32_t>(v);
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

// The elementwise ops on one element of their computing type T (float,
// double, int32_t, uint32_t or bool; an op the builder never gives a type
// returns a value of no meaning, so every pair compiles). int32 arithmetic
// wraps; bool + is or, bool * is and.
template <typename T>
T ScalarAdd(T x, T y) {
  if constexpr (std::is_same_v<T, int32_t>) return Wrap(uint32_t(x) + uint32_t(y));
  if constexpr (std::is_same_v<T, bool>) return x || y;
  if constexpr (!std::is_same_v<T, int32_t> && !std::is_same_v<T, bool>) return T(x + y);
}
template <typename T>
T ScalarSub(T x, T y) {
  if constexpr (std::is_same_v<T, int32_t>) return Wrap(uint32_t(x) - uint32_t(y));
  if constexpr (std::is_same_v<T, bool>) return x != y;
  if constexpr (!std::is_same_v<T, int32_t> && !std::is_same_v<T, bool>) return T(x - y);
}
template <typename T>
T ScalarMul(T x, T y) {
  if constexpr (std::is_same_v<T, int32_t>) return Wrap(uint32_t(x) * uint32_t(y));
  if constexpr (std::is_same_v<T, bool>) return x && y;
  if constexpr (!std::is_same_v<T, int32_t> && !std::is_same_v<T, bool>) return T(x * y);
}
// Integers divide in float64 (the builder converts): only floats come here.
template <typename T>
T ScalarDiv(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) return x / y;
  if constexpr (!std::is_floating_point_v<T>) return x;
}
template <typename T>
T ScalarPow(T x, T y) {
  if constexpr (std::is_same_v<T, int32_t>) return IntPow(x, y);
  if constexpr (std::is_same_v<T, uint32_t>) return UintPow(x, y);
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::pow(x, y));
  if constexpr (std::is_same_v<T, bool>) return x;
}
// Truncated: the sign of x. By zero, x (XLA's); INT32_MIN rem -1 is 0 (C's %
// would trap on the quotient's overflow).
template <typename T>
T ScalarRem(T x, T y) {
  if constexpr (std::is_same_v<T, int32_t>) return y == 0 ? x : (y == -1 ? T(0) : T(x % y));
  if constexpr (std::is_same_v<T, uint32_t>) return y == 0 ? x : T(x % y);
  if constexpr (std::is_floating_point_v<T>) return T(std::fmod(x, y));
  if constexpr (std::is_same_v<T, bool>) return x;
}
// atan2(y, x), in double.
template <typename T>
T ScalarAtan2(T y, T x) {
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::atan2(double{y}, double{x}));
  if constexpr (!std::is_floating_point_v<T>) return y;
}
template <typename T>
T ScalarNeg(T v) {
  if constexpr (std::is_same_v<T, int32_t>) return Wrap(0u - uint32_t(v));
  if constexpr (std::is_same_v<T, uint32_t>) return T(0u - v);
  if constexpr (!std::is_integral_v<T>) return -v;
  if constexpr (std::is_same_v<T, bool>) return v;
}
template <typename T>
T ScalarAbs(T v) {
  if constexpr (std::is_same_v<T, int32_t>) return v < 0 ? Wrap(0u - uint32_t(v)) : v;
  if constexpr (std::is_floating_point_v<T>) return std::abs(v);
  if constexpr (!std::is_same_v<T, int32_t> && !std::is_floating_point_v<T>) return v;
}

// One element converted between the computing types (bfloat16 is the
// kernels' business: through float32, elementwise.cc): to bool, nonzero;
// from floating point to int32 and uint32 as ToInt32 and ToUint32; between
// integers modulo 2^32 (C++20).
template <typename Out, typename In>
Out ConvertScalar(In v) {
  if constexpr (std::is_same_v<Out, bool>) {
    return v != In(0);
  } else if constexpr (std::is_same_v<Out, int32_t> && std::is_floating_point_v<In>) {
    return ToInt32(v);
  } else if constexpr (std::is_same_v<Out, uint32_t> && std::is_floating_point_v<In>) {
    return ToUint32(v);
  } else {
    return static_cast<Out>(v);
  }
}

template <typename T>
T ReduceAdd(T a, T b) {
  if constexpr (std::is_same_v<T, int32_t>) {  // wraps (uint32_t's + does by itself)
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  } else if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else {
    return a + b;
  }
}

// The sum of x[0], x[1], ... x[n-1] in T: pairwise, as numpy sums a
// contiguous run (8 running sums over blocks of up to 128 elements, halves
// above), which is both more accurate than one running sum and vectorizes.
template <typename T>
T PairwiseSum(const T* x, int64_t n) {
  if (n < 8) {
    T acc = T(0);
    for (int64_t i = 0; i < n; ++i) acc = acc + x[i];
    return acc;
  }
  if (n <= 128) {
    T r[8];
    for (int j = 0; j < 8; ++j) r[j] = x[j];
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) r[j] = r[j] + x[i + j];
    }
    T acc = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) acc = acc + x[i];
    return acc;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return PairwiseSum(x, half) + PairwiseSum(x + half, n - half);
}

// The maximum (min = false: minimum) of x[0], ..., x[n-1], n >= 1, as
// Max (Min) folds them in order: the first NaN if there is one, else the
// extreme value, and of +0 and -0 the later one.
template <typename T>
T RunMaxInOrder(const T* x, int64_t n, bool max) {
  T acc = x[0];
  if (max) {
    for (int64_t i = 1; i < n; ++i) acc = Max(acc, x[i]);
  } else {
    for (int64_t i = 1; i < n; ++i) acc = Min(acc, x[i]);
  }
  return acc;
}

// The same bits, faster: 8 running extremes (a loop that vectorizes), and
// the in-order fold only when its result could differ: a NaN, or an
// extreme of zero (whose sign the order decides). Any other extreme value
// has one bit pattern, wherever it occurs.
template <typename T>
T RunMax(const T* x, int64_t n, bool max) {
  if (!std::is_floating_point_v<T> || n < 16) return RunMaxInOrder(x, n, max);
  T r[8];
  bool nan = false;
  for (int j = 0; j < 8; ++j) r[j] = x[j];
  int64_t i = 8;
  if (max) {
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const T v = x[i + j];
        nan |= v != v;  // NOLINT: NaN check
        r[j] = v > r[j] ? v : r[j];
      }
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const T v = x[i + j];
        nan |= v != v;  // NOLINT: NaN check
        r[j] = v < r[j] ? v : r[j];
      }
    }
  }
  T acc = r[0];
  for (int j = 0; j < 8; ++j) {
    nan |= r[j] != r[j];  // NOLINT: NaN check (the first 8)
    acc = max ? (r[j] > acc ? r[j] : acc) : (r[j] < acc ? r[j] : acc);
  }
  for (; i < n; ++i) {
    nan |= x[i] != x[i];  // NOLINT: NaN check
    acc = max ? (x[i] > acc ? x[i] : acc) : (x[i] < acc ? x[i] : acc);
  }
  if (nan || acc == T(0)) return RunMaxInOrder(x, n, max);
  return acc;
}

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_SCALAR_OPS_H_
