#include "csrc/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
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

namespace {

// --- erf and erfc -------------------------------------------------------------
//
// Our own approximations (derive_erf_coefficients.py derives the tables from
// Chebyshev interpolants in 80-digit arithmetic):
//   erf(x)  = x P(x^2)                  for |x| < 0.85 (fitted on [0, 1]),
//   erfc(z) = exp(-z^2) t H(2t - 1)     for z >= 0.47, t = 4 / (4 + z),
// and erf = 1 - erfc, erfc = 1 - erf, erfc(-z) = 2 - erfc(z) elsewhere. Each
// is as accurate as the rounding of its last steps allows only if the steps
// before are nearly exact, so the error-prone ones carry a correction:
// - z^2 = p + e exactly (a fused multiply-add gives e), and exp(-z^2) =
//   exp(-p) (1 - e): p alone would cost |z^2| ulp (700 near z = 26.5).
// - t = 4 / (4 + z) is rounded twice; its error dt, and the rounding of
//   d = s - center, would be amplified by d log(erfc e^{z^2}) / d log t (up
//   to 4): both are computed exactly (TwoSum, fma residual) and applied
//   through the derivative d/dt (t H) = (2 z t H - 2 / sqrt(pi)) (-4 / t^2).
// - H's constant term, the sum of Horner's rule, and the product t H are
//   each carried in two doubles (hi + lo) until the last product.
// The cut-overs keep the subtractions exact or harmless: at |x| = 0.85 erfc
// is 0.23, so erf = 1 - erfc has a quarter of erfc's error (P's error grows
// toward 1, where x^2 P' / P nears 0.3); at 0.47, erf < 0.5 <= erfc, so
// erfc = 1 - erf is exact (Sterbenz) but for erf's own error, which is half
// an ulp of erfc.
// float is computed in double and rounded once.

struct ErfcPiece {
  double center;          // of d = s - center
  double c0_hi, c0_lo;    // H(center) in two doubles
  int degree;             // of the rest
  double c[15];           // coefficients of d^1 ... d^degree
};

// clang-format off
constexpr double kErfP0Hi = 1.1283791670955125586;
constexpr double kErfP0Lo = 1.5333334949368299478e-17;
constexpr double kErfP[] = {
    -3.761263890318375238e-1, 1.1283791670955120298e-1, -2.6866170645129854479e-2,
    5.2239776254234543525e-3, -8.5483270219454273153e-4, 1.2055332903350668265e-4,
    -1.4925647581008592978e-5, 1.6462045711013025157e-6, -1.6364645854816387701e-7,
    1.4792435426962471013e-8, -1.2164764337224505578e-9, 8.709755232851789716e-11,
    -4.2320376764874592264e-12,
};
constexpr ErfcPiece kErfcPieces[] = {
    {-0.75, 1.6109441571371421742e-1, -3.2077342429306097903e-18, 14,
     {
         9.1117607046531340541e-2, 4.9408219126707761376e-2, 2.5574152467701983781e-2,
         1.256720140620991617e-2, 5.8210896454471023501e-3, 2.5167495297330910439e-3,
         1.0012515655010469137e-3, 3.5830572844224970817e-4, 1.1066702813108919367e-4,
         2.6813054225717279202e-5, 3.4619151278185317229e-6, -9.0636233959005572327e-7,
         -7.9937403935407681528e-7, -2.6336424314216254142e-7,
     }},
    {-0.25, 2.2321819202394763137e-1, -1.1516327663061513099e-17, 15,
     {
         1.6841737149373880299e-1, 1.1710601023610037851e-1, 7.4542385209789360266e-2,
         4.3035328662595980861e-2, 2.2233036271204654944e-2, 1.0066297075536019018e-2,
         3.8532569887216745732e-3, 1.1572517764663125689e-3, 2.1641210649726864475e-4,
         -1.1807102088801726944e-5, -2.6162152780870953887e-5, -8.50962253484786712e-6,
         5.5662104409372698846e-8, 1.044956462132128806e-6, 2.9182029004144868918e-7,
     }},
    {0.25, 3.4959797525925334627e-1, -2.659292292398654737e-17, 15,
     {
         3.7228391666762676522e-1, 3.3379148780168375085e-1, 2.5206824959734722677e-1,
         1.5901825629752940451e-1, 8.2137133622950947591e-2, 3.3285560744185316555e-2,
         9.5377686370940621918e-3, 1.2569840483207174958e-3, -3.5434694290679725209e-4,
         -2.1482585803354109165e-4, -1.9954057372110771061e-5, 1.729968055010336487e-5,
         5.0484258388122262227e-6, -1.1915701012167385339e-6, -6.8140556218570773181e-7,
     }},
    {0.625, 5.5329323013595976821e-1, 1.7895620522394531899e-17, 13,
     {
         7.7230882011467798032e-1, 8.0629398029120428765e-1, 6.4821998675721755704e-1,
         4.0212138863634910102e-1, 1.8761424699999818619e-1, 6.0793046341751774905e-2,
         1.0145019404124359273e-2, -1.2685577144989308492e-3, -1.0681280128532901662e-3,
         -9.6517114537563101931e-5, 7.6498305450130606498e-5, 1.5918921786190172993e-5,
         -6.5177196549005884251e-6,
     }},
};
// clang-format on

constexpr double kTwoOverSqrtPi = 1.1283791670955125739;

// a + b = s + err exactly (Knuth's TwoSum).
inline double TwoSum(double a, double b, double* err) {
  const double s = a + b;
  const double bb = s - a;
  *err = (a - (s - bb)) + (b - bb);
  return s;
}

// erf(x) for |x| < 1.
inline double ErfSmall(double x) {
  const double u = x * x;
  double q = kErfP[std::size(kErfP) - 1];
  for (size_t i = std::size(kErfP) - 1; i-- > 0;) q = std::fma(q, u, kErfP[i]);
  // x (P0 + u q) with x P0 exact inside the fma: the last rounding dominates.
  return std::fma(x, kErfP0Hi, x * std::fma(u, q, kErfP0Lo));
}

// erfc(z) for 0.47 <= z <= 28 (erfc(28) underflows to 0 in double).
inline double ErfcLarge(double z) {
  double ew;
  const double w = TwoSum(4.0, z, &ew);
  const double t = 4.0 / w;
  // The exact 4 / (4 + z) is t + dt: 4 - t w is exact in an fma.
  double dt = (std::fma(-t, w, 4.0) - t * ew) / w;
  const double s = 2.0 * t - 1.0;
  const ErfcPiece& piece =
      kErfcPieces[s > 0.5 ? 3 : s > 0.0 ? 2 : s > -0.5 ? 1 : 0];
  // d = 2t - (1 + center): 2t and 1 + center are exact; the sum's rounding
  // moves the point H is evaluated at, which dt takes in.
  double derr;
  const double d = TwoSum(2.0 * t, -(1.0 + piece.center), &derr);
  dt += derr / 2.0;
  double q = piece.c[piece.degree - 1];
  for (int i = piece.degree - 1; i-- > 0;) q = std::fma(q, d, piece.c[i]);
  double h_lo;
  const double h = TwoSum(piece.c0_hi, std::fma(d, q, piece.c0_lo), &h_lo);
  const double k = t * h;  // erfc(z) exp(z^2) at the rounded t ...
  const double k_lo = std::fma(t, h, -k) + t * h_lo;
  const double dk = (2.0 * z * k - kTwoOverSqrtPi) * (-4.0 / (t * t)) * dt;  // ... moved to the exact one
  const double p = z * z;
  const double e = std::fma(z, z, -p);
  return std::exp(-p) * (k + (k_lo + dk - e * k));
}

inline double ErfOf(double x) {
  const double z = std::fabs(x);
  if (z < 0.85) return ErfSmall(x);  // NaN is not: below
  if (!(z < 6.0)) return std::isnan(x) ? x : std::copysign(1.0, x);  // erfc(6) < 2^-54
  return std::copysign(1.0 - ErfcLarge(z), x);
}

inline double ErfcOf(double x) {
  const double z = std::fabs(x);
  if (z < 0.47) return 1.0 - ErfSmall(x);
  if (std::isnan(x)) return x;
  const double r = z < 28.0 ? ErfcLarge(z) : 0.0;
  return x < 0 ? 2.0 - r : r;
}

}  // namespace

void Erf(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(ErfOf(x[i]));
}

void Erf(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ErfOf(x[i]);
}

void Erfc(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(ErfcOf(x[i]));
}

void Erfc(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ErfcOf(x[i]);
}

}  // namespace pw
