#include "csrc/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "Eigen/Core"

// Compiled with -fno-math-errno (CMakeLists.txt): otherwise std::sqrt must
// set errno for a negative argument, and the compiler cannot turn a loop of
// it into vector square roots.

namespace pw {
namespace {

// Elements per block: the block is copied to aligned stack buffers, so that
// Eigen runs whole packets only (no scalar prologue or tail, whose functions
// differ from the vectorized ones in the last bits) and y may alias x.
constexpr int64_t kBlock = 512;
// A multiple of every Eigen packet size (64 bytes of float: AVX-512).
constexpr int64_t kPad = 16;

template <typename T>
using AlignedArray = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::AlignedMax>;
template <typename T>
using ConstAlignedArray =
    Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::AlignedMax>;

// The driver shared by the Eigen-based functions. For each block of x:
// copies it to `in` (padded with zeros to a multiple of kPad), calls
// vector(in, out, padded_length), then replaces out[i] by slow(in[i]) for
// every element where !fast_path(in[i]), and copies out to y. vector() only
// needs to be right where fast_path() holds; fast_path() is meant to be a
// cheap comparison the compiler vectorizes, and to fail rarely.
template <typename T, typename Vector, typename FastPath, typename Slow>
void ForEachBlock(const T* x, T* y, int64_t n, Vector vector, FastPath fast_path, Slow slow) {
  alignas(64) T in[kBlock];
  alignas(64) T out[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const int64_t padded = (m + kPad - 1) / kPad * kPad;
    std::copy_n(x + start, m, in);
    std::fill(in + m, in + padded, T(0));
    vector(in, out, padded);
    int any_slow = 0;  // an int and `|`: GCC vectorizes this loop, not a bool and `&=`
    for (int64_t i = 0; i < m; ++i) any_slow |= !fast_path(in[i]);
    if (any_slow) {
      for (int64_t i = 0; i < m; ++i) {
        if (!fast_path(in[i])) out[i] = slow(in[i]);
      }
    }
    std::copy_n(out, m, y + start);
  }
}

// float through double: converts `in` to double, calls f(a) on the double
// array (f computes the function in place) and rounds back to float. In
// double, the functions below err by a few ulp of double, i.e. about 2^-29
// ulp of float, so the rounded result is the correctly rounded one unless the
// exact value lies that close to a midpoint between two floats.
template <typename F>
void InDouble(const float* in, float* out, int64_t n, F f) {
  alignas(64) double d[kBlock];
  for (int64_t i = 0; i < n; ++i) d[i] = in[i];
  AlignedArray<double> a(d, n);
  f(a);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(d[i]);
}

// Fast-path tests: functors, so that the compiler inlines them, and int `&`
// rather than `&&`, whose branch would keep the loop over them scalar (and
// `&` of two bools draws a clang warning).
constexpr auto kNotNan = [](auto v) { return !std::isnan(v); };

// Between the smallest normal number and the largest: Eigen's log is right
// there, but takes a denormal argument for the smallest normal (log(1e-40f)
// gives -87.3), and would give NaN, -inf and inf itself elsewhere.
constexpr auto kPositiveNormal = [](auto v) {
  using T = decltype(v);
  return int{v >= std::numeric_limits<T>::min()} & int{v <= std::numeric_limits<T>::max()};
};

}  // namespace

// float exp in double: exp(x) of every finite float x is a normal double or
// rounds to 0 or inf in float, and Eigen's double exp clamps its argument to
// ±709.784, so exp(±inf) come out right too (inf, and a tiny double that
// rounds to 0). Eigen's own float exp errs by up to 4.5 ulp near |x| = 88
// with AVX-512 (which reduces the argument by a single float ln 2) and by
// 1.3 ulp elsewhere; below the normal range it gives 0 (AVX-512) or 2.9e-39
// for any x, even -inf (SSE, AVX2).
void Exp(const float* x, float* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const float* in, float* out, int64_t m) {
        InDouble(in, out, m, [](auto& a) { a = a.exp(); });
      },
      kNotNan, [](float v) { return std::exp(v); });
}

// Eigen's double exp is right while the result is a normal double: it
// clamps its argument to ±709.784, so below the normal range every result is
// 5.6e-309 (exp(-745.2) and exp(-inf) too). 709.0: safely below the clamp
// and the overflow at 709.78.
void Exp(const double* x, double* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const double* in, double* out, int64_t m) {
        AlignedArray<double>(out, m) = ConstAlignedArray<double>(in, m).exp();
      },
      [](double v) { return int{v >= -708.0} & int{v <= 709.0}; }, [](double v) { return std::exp(v); });
}

void Log(const float* x, float* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const float* in, float* out, int64_t m) {
        AlignedArray<float>(out, m) = ConstAlignedArray<float>(in, m).log();
      },
      kPositiveNormal, [](float v) { return std::log(v); });
}

void Log(const double* x, double* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const double* in, double* out, int64_t m) {
        AlignedArray<double>(out, m) = ConstAlignedArray<double>(in, m).log();
      },
      kPositiveNormal, [](double v) { return std::log(v); });
}

// tanh(x) = (e - 1) / (e + 1) with e = exp(2x) in double: for |x| >= 2^-12
// the subtraction loses at most 11 of double's 53 bits; below, tanh(x)
// rounds to x in float. |x| is clamped to 10, where tanh rounds to 1.
// (Eigen's float tanh, a rational approximation, errs by up to 4.8 ulp.)
void Tanh(const float* x, float* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const float* in, float* out, int64_t m) {
        InDouble(in, out, m, [](auto& a) {
          a = (2.0 * a.max(-10.0).min(10.0)).exp();
          a = (a - 1.0) / (a + 1.0);
        });
        for (int64_t i = 0; i < m; ++i) {
          if (std::fabs(in[i]) < 0x1p-12f) out[i] = in[i];
        }
      },
      kNotNan, [](float v) { return std::tanh(v); });
}

void Tanh(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

// Eigen's float sin and cos reduce huge arguments exactly (Payne-Hanek, per
// element, inside the vectorized function).
void Sin(const float* x, float* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const float* in, float* out, int64_t m) {
        AlignedArray<float>(out, m) = ConstAlignedArray<float>(in, m).sin();
      },
      kNotNan, [](float v) { return std::sin(v); });
}

void Sin(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::sin(x[i]);
}

void Cos(const float* x, float* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const float* in, float* out, int64_t m) {
        AlignedArray<float>(out, m) = ConstAlignedArray<float>(in, m).cos();
      },
      kNotNan, [](float v) { return std::cos(v); });
}

void Cos(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::cos(x[i]);
}

// Not Eigen's sqrt: with EIGEN_FAST_MATH (which its vectorized float sin,
// cos and tanh need) its AVX-512 sqrt is a reciprocal-square-root estimate
// and a Newton step, a few ulp off, NaN for inf and 0 for denormals.
void Sqrt(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
}

void Sqrt(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
}

void Rsqrt(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(1.0 / std::sqrt(double{x[i]}));
}

void Rsqrt(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0 / std::sqrt(x[i]);
}

// 1 / (1 + exp(-x)) in double, x clamped to +-120 (where the result rounds
// to 0 or 1 in float). (Eigen's float logistic, a rational approximation of
// logistic(x) - 0.5, loses all relative accuracy as the result nears 0: up
// to 8400 ulp at x = -8.4.)
void Logistic(const float* x, float* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const float* in, float* out, int64_t m) {
        InDouble(in, out, m, [](auto& a) {
          a = 1.0 / (1.0 + (-a.max(-120.0).min(120.0)).exp());
        });
      },
      kNotNan, [](float v) { return static_cast<float>(1.0 / (1.0 + std::exp(-double{v}))); });
}

// e = exp(-|x|) <= 1, then 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0:
// no overflow, and the small results of negative x keep their relative
// accuracy. Beyond |x| = 708, e would be denormal (Eigen's exp gets those
// wrong): the result is 1, or exp(x) to within rounding.
void Logistic(const double* x, double* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const double* in, double* out, int64_t m) {
        AlignedArray<double>(out, m) = (-ConstAlignedArray<double>(in, m).abs()).exp();
        for (int64_t i = 0; i < m; ++i) out[i] = (in[i] < 0 ? out[i] : 1.0) / (1.0 + out[i]);
      },
      [](double v) { return std::fabs(v) <= 708.0; },
      [](double v) {
        const double e = std::exp(-std::fabs(v));  // NaN for NaN
        return (v < 0 ? e : 1.0) / (1.0 + e);
      });
}

}  // namespace pw
