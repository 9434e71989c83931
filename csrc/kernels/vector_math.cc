#include "csrc/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// --- float exp, tanh, logistic and log ---------------------------------------
//
// For the fused elementwise loops (issue 26), which call these on chunks of
// at most 256 elements or on single elements: computed in float, with
// Eigen's packet primitives, a packet of 16, 8 or 4 floats at a time
// (AVX-512, AVX or SSE2), from tables and short polynomials. The exactness
// arguments below (an fma's exact product, Fast2Sum) make them about as
// accurate as one rounding allows: see vector_math.h for the bounds. Every
// element, the last few too, goes through the same packet code
// (ForEachPacket), so results depend only on the input value. The compiler
// may fuse a product and a sum into an fma (GCC does by default): that only
// removes a rounding, and the code is the same for every element.

namespace ei = Eigen::internal;
using Packet = ei::packet_traits<float>::type;
constexpr int64_t kLanes = ei::packet_traits<float>::size;

// Whether any lane of v is below c.
inline bool AnyBelow(Packet v, float c) {
#ifdef EIGEN_VECTORIZE_AVX512
  return _mm512_cmp_ps_mask(v, ei::pset1<Packet>(c), _CMP_LT_OQ) != 0;
#else
  return ei::predux_any(ei::pcmp_lt(v, ei::pset1<Packet>(c)));
#endif
}

// kernel(in), but a NaN input's own NaN (quieted) where in is NaN, as std::
// and numpy give it: the kernels' arithmetic would make the default NaN,
// whose sign bit is set.
template <typename Kernel>
inline Packet KeepNan(Kernel& kernel, Packet in) {
  return ei::pselect(ei::pcmp_eq(in, in), kernel(in), ei::padd(in, in));
}

// y[i] = kernel(x[i]) a packet at a time, the last partial packet through a
// zero-padded buffer; then y[i] = scalar(x[i]) where x[i] < rare_below (rare
// inputs the kernel does not take; never NaN). The scalar calls wait for the
// end of a chunk of kChunk elements: a call inside the packet loop would
// make the compiler keep the kernel's constants in memory.
template <typename Kernel, typename Scalar>
void ForEachPacket(const float* x, float* y, int64_t n, Kernel kernel, float rare_below, Scalar scalar) {
  constexpr int64_t kChunk = 512;
  static_assert(kChunk % kLanes == 0);
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    // The packets with a rare lane: their inputs (y may be x) and offsets.
    alignas(64) float rare_x[kChunk];
    int64_t rare_at[kChunk / kLanes];
    int64_t rare_count = 0;
    auto apply = [&](Packet in, int64_t i) {
      if (AnyBelow(in, rare_below)) {
        ei::pstore(rare_x + rare_count * kLanes, in);
        rare_at[rare_count++] = i;
      }
      return KeepNan(kernel, in);
    };
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes) ei::pstoreu(y + i, apply(ei::ploadu<Packet>(x + i), i));
    if (i < end) {
      alignas(64) float buf[kLanes] = {};
      std::copy_n(x + i, end - i, buf);
      ei::pstore(buf, apply(ei::pload<Packet>(buf), i));
      std::copy_n(buf, end - i, y + i);
    }
    for (int64_t r = 0; r < rare_count; ++r) {
      for (int64_t lane = 0; lane < kLanes && rare_at[r] + lane < end; ++lane) {
        const float v = rare_x[r * kLanes + lane];
        if (v < rare_below) y[rare_at[r] + lane] = scalar(v);
      }
    }
  }
}

template <typename Kernel>
void ForEachPacket(const float* x, float* y, int64_t n, Kernel kernel) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) ei::pstoreu(y + i, KeepNan(kernel, ei::ploadu<Packet>(x + i)));
  if (i < n) {
    alignas(64) float buf[kLanes] = {};
    std::copy_n(x + i, n - i, buf);
    ei::pstore(buf, KeepNan(kernel, ei::pload<Packet>(buf)));
    std::copy_n(buf, n - i, y + i);
  }
}

// Below -87.3, exp(x) < 2^-126 is denormal (or 0): ExpReduced and Pow2Scale
// would round twice. Those results are std::exp in double, rounded once;
// below -104, exp(x) < 2^-150 rounds to +0 without asking libm (whose
// underflow path is slow, and a causal mask's -1e9 or -inf meets it in half
// of every attention row).
constexpr float kExpDenormal = -87.3f;
const auto kExpInDouble = [](float v) {
  return v < -104.0f ? 0.0f : static_cast<float>(std::exp(double{v}));
};

// c - a b, rounded once with FMA. (Eigen 3.4 has no pnmadd, and its pnegate
// is a subtraction from 0, which the compiler may not fold into the fma.)
inline Packet Nmadd(Packet a, Packet b, Packet c) {
#if defined(EIGEN_VECTORIZE_AVX512)
  return _mm512_fnmadd_ps(a, b, c);
#elif defined(EIGEN_VECTORIZE_FMA) && defined(EIGEN_VECTORIZE_AVX)
  return _mm256_fnmadd_ps(a, b, c);
#elif defined(EIGEN_VECTORIZE_FMA)
  return _mm_fnmadd_ps(a, b, c);
#else
  return ei::psub(c, ei::pmul(a, b));
#endif
}

inline Packet SignBit(Packet v) { return ei::pand(v, ei::pset1frombits<Packet>(0x80000000u)); }

// Adding 1.5 2^23 to |v| < 2^22 rounds it to an integer k (to nearest, ties
// to even), and leaves k's two's complement in the low bits of the sum.
constexpr float kRoundShifter = 0x1.8p23f;

// table[k mod N] for each lane, k in the low bits of `shifted` (a sum with
// kRoundShifter); N = 16 or 32. AVX-512 has it in one instruction (vpermps,
// vpermt2ps); elsewhere it goes through memory, lane by lane.
template <int N>
inline Packet Lookup(const float (&table)[N], Packet shifted) {
  static_assert(N == 16 || N == 32);
#ifdef EIGEN_VECTORIZE_AVX512
  const __m512i index = _mm512_castps_si512(shifted);
  if constexpr (N == 16) {
    return _mm512_permutexvar_ps(index, ei::pload<Packet>(table));
  } else {
    return _mm512_permutex2var_ps(ei::pload<Packet>(table), index, ei::pload<Packet>(table + 16));
  }
#else
  alignas(64) float lanes[kLanes];
  ei::pstore(lanes, shifted);
  for (int64_t i = 0; i < kLanes; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &lanes[i], sizeof bits);
    lanes[i] = table[bits % N];
  }
  return ei::pload<Packet>(lanes);
#endif
}

// p 2^floor(k / 16) for integral k with floor(k / 16) in [-151, 128],
// rounded once (to a denormal, 0 or inf).
inline Packet Pow2Scale(Packet p, Packet k) {
#ifdef EIGEN_VECTORIZE_AVX512
  return _mm512_scalef_ps(p, ei::pmul(k, ei::pset1<Packet>(0.0625f)));
#else
  // Two factors 2^(m/2), each a normal float.
#ifdef EIGEN_VECTORIZE_AVX
  using PacketI = ei::Packet8i;
#else
  using PacketI = ei::Packet4i;
#endif
  const PacketI m = ei::parithmetic_shift_right<4>(ei::pcast<Packet, PacketI>(k));
  const PacketI m1 = ei::parithmetic_shift_right<1>(m);
  const PacketI bias = ei::pset1<PacketI>(127);
  const Packet s1 = ei::preinterpret<Packet>(ei::plogical_shift_left<23>(ei::padd(m1, bias)));
  const Packet s2 = ei::preinterpret<Packet>(ei::plogical_shift_left<23>(ei::padd(ei::psub(m, m1), bias)));
  return ei::pmul(ei::pmul(p, s1), s2);
#endif
}

// Lane masks: AVX-512's mask registers, elsewhere packets of all-ones lanes.
#ifdef EIGEN_VECTORIZE_AVX512
using Mask = __mmask16;
inline Mask Less(Packet a, Packet b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
inline Packet Select(Mask m, Packet a, Packet b) { return _mm512_mask_blend_ps(m, b, a); }
// Pow2Scale where m is set, p elsewhere.
inline Packet Pow2ScaleWhere(Mask m, Packet p, Packet k) {
  return _mm512_mask_scalef_ps(p, m, p, ei::pmul(k, ei::pset1<Packet>(0.0625f)));
}
#else
using Mask = Packet;
inline Mask Less(Packet a, Packet b) { return ei::pcmp_lt(a, b); }
inline Packet Select(Mask m, Packet a, Packet b) { return ei::pselect(m, a, b); }
inline Packet Pow2ScaleWhere(Mask m, Packet p, Packet k) { return ei::pselect(m, Pow2Scale(p, k), p); }
#endif

// An approximation of 1 / d for d in [0.5, 2]: with AVX-512 the estimate
// (relative error 2^-14), otherwise the quotient. It is used in a Newton
// step on an exact remainder, whose error is of order its square.
inline Packet Reciprocal(Packet d) {
#ifdef EIGEN_VECTORIZE_AVX512
  return _mm512_rcp14_ps(d);
#else
  return ei::pdiv(ei::pset1<Packet>(1.0f), d);
#endif
}

// (num + num_lo) / (den + den_lo) to within about 2^-28 before its last
// rounding, for den + den_lo in [0.5, 2]. With FMA: a first quotient q0,
// then a Newton step on the remainder num - q0 den, which is exact in an
// fma. With kSmallLo, |num_lo| <= ulp(num) and |den_lo| <= ulp(den) and q0
// is num / den; otherwise the lo parts are up to 2^-6 of the hi parts and
// enter q0. Without FMA the remainder would not be exact: the quotient is
// computed in double instead (the sums are exact there), lane by lane.
template <bool kSmallLo>
inline Packet Divide(Packet num, Packet num_lo, Packet den, Packet den_lo) {
#ifdef EIGEN_VECTORIZE_FMA
  const Packet r = Reciprocal(kSmallLo ? den : ei::padd(den, den_lo));
  const Packet q0 = ei::pmul(kSmallLo ? num : ei::padd(num, num_lo), r);
  const Packet rem = Nmadd(q0, den_lo, ei::padd(Nmadd(q0, den, num), num_lo));
  return ei::pmadd(rem, r, q0);
#else
  alignas(64) float parts[4][kLanes];
  ei::pstore(parts[0], num);
  ei::pstore(parts[1], num_lo);
  ei::pstore(parts[2], den);
  ei::pstore(parts[3], den_lo);
  for (int64_t i = 0; i < kLanes; ++i) {
    parts[0][i] = static_cast<float>((double{parts[0][i]} + parts[1][i]) / (double{parts[2][i]} + parts[3][i]));
  }
  return ei::pload<Packet>(parts[0]);
#endif
}

// exp(x) = (hi + lo) 2^floor(k / 16) for x in [-104, 89]: k = round(x 16 /
// ln 2) and exp(x) = 2^(k/16) e^r with |r| <= ln 2 / 32; 2^(j/16), j = k mod
// 16, comes from a table as two floats and e^r - 1 from a polynomial. hi is
// in [0.97, 1.96], |lo| <= ulp(hi) / 2, and hi + lo is within 2^-28 of the
// exact value relative to it; NaN gives NaN.
struct ExpParts {
  Packet hi, lo, k;
};

// 2^(j/16) = hi + lo.
alignas(64) constexpr float kExp2Hi[16] = {
    0x1p+0f,        0x1.0b5586p+0f, 0x1.172b84p+0f, 0x1.2387a6p+0f, 0x1.306fep+0f,  0x1.3dea64p+0f,
    0x1.4bfdaep+0f, 0x1.5ab07ep+0f, 0x1.6a09e6p+0f, 0x1.7a1148p+0f, 0x1.8ace54p+0f, 0x1.9c4918p+0f,
    0x1.ae89fap+0f, 0x1.c199bep+0f, 0x1.d5818ep+0f, 0x1.ea4afap+0f};
alignas(64) constexpr float kExp2Lo[16] = {
    0.0f,            0x1.9f3122p-25f, -0x1.c15742p-27f, 0x1.ceac48p-25f,  0x1.4636e2p-25f,  0x1.824684p-25f,
    -0x1.593abcp-25f, -0x1.5bd5ecp-27f, 0x1.9fcef4p-26f,  -0x1.829fdp-25f,  0x1.15506ep-27f,  0x1.51f848p-27f,
    -0x1.a94b14p-26f, -0x1.3d56b2p-27f, -0x1.822dbcp-27f, 0x1.52486cp-27f};

inline ExpParts ExpReduced(Packet x) {
  const Packet shifter = ei::pset1<Packet>(kRoundShifter);
  const Packet shifted = ei::pmadd(x, ei::pset1<Packet>(0x1.715476p+4f), shifter);  // 16 / ln 2
  const Packet k = ei::psub(shifted, shifter);
  // r = x - k ln2/16: k has at most 12 bits and ln2/16's leading part 12, so
  // their product is exact (without FMA too), and so is the difference (|r|
  // < 2^-5 and ulp(x) >= 2^-29 where k != 0); the rest of ln2/16 adds a
  // rounding of at most 2^-30.
  const Packet r = ei::pmadd(k, ei::pset1<Packet>(-0x1.0bfbe8p-19f),
                             ei::pmadd(k, ei::pset1<Packet>(-0x1.62ep-5f), x));
  // s = e^r - 1 = r + r^2 (c2 + c3 r), minimax: relative error of e^r 2^-28.6.
  const Packet c = ei::pmadd(ei::pset1<Packet>(0x1.55576cp-3f), r, ei::pset1<Packet>(0x1.00029ep-1f));
  const Packet s = ei::pmadd(ei::pmul(r, r), c, r);
  // 2^(j/16) e^r = t_hi + (t_hi s + t_lo), the sum kept exactly (Fast2Sum).
  const Packet t_hi = Lookup(kExp2Hi, shifted);
  const Packet tail = ei::pmadd(t_hi, s, Lookup(kExp2Lo, shifted));
  const Packet hi = ei::padd(t_hi, tail);
  return {hi, ei::padd(ei::psub(t_hi, hi), tail), k};
}

// tanh(j 5/16) = hi + lo, j = 0 ... 31 (29 at most is used).
constexpr float kTanhStep = 0.3125f;
alignas(64) constexpr float kTanhHi[32] = {
    0.0f,           0x1.35f98ap-2f, 0x1.1bf47ep-1f, 0x1.77d838p-1f, 0x1.b2523cp-1f, 0x1.d4e6f4p-1f,
    0x1.e8789ep-1f, 0x1.f3451ep-1f, 0x1.f92582p-1f, 0x1.fc51f6p-1f, 0x1.fe06ecp-1f, 0x1.fef168p-1f,
    0x1.ff6f18p-1f, 0x1.ffb26ap-1f, 0x1.ffd678p-1f, 0x1.ffe9c4p-1f, 0x1.fff41ap-1f, 0x1.fff9a2p-1f,
    0x1.fffc98p-1f, 0x1.fffe2cp-1f, 0x1.ffff06p-1f, 0x1.ffff7ap-1f, 0x1.ffffb8p-1f, 0x1.ffffdap-1f,
    0x1.ffffecp-1f, 0x1.fffff6p-1f, 0x1.fffffap-1f, 0x1.fffffcp-1f, 0x1.fffffep-1f, 0x1p+0f,
    0x1p+0f,        0x1p+0f};
alignas(64) constexpr float kTanhLo[32] = {
    0.0f,            0x1.d4ca1cp-31f, 0x1.5771f2p-26f,  0x1.c680bp-26f,   -0x1.253484p-27f, 0x1.90a1acp-27f,
    0x1.9d81bcp-26f, 0x1.133c42p-30f, 0x1.829c7p-27f,   -0x1.2c7f04p-26f, -0x1.f2efbep-26f, 0x1.2e912ep-28f,
    -0x1.62ae24p-27f, 0x1.4f02f4p-26f, -0x1.e612ap-27f,  0x1.b5976p-27f,   -0x1.32e41ep-26f, -0x1.85ea0ap-26f,
    -0x1.c987f2p-26f, 0x1.8ab262p-26f, -0x1.72ce6ep-29f, 0x1.166f42p-28f,  0x1.640478p-27f,  -0x1.69363p-27f,
    -0x1.0eb872p-26f, -0x1.f9fbecp-26f, 0x1.e50522p-29f, 0x1.b420dep-26f,  0x1.42745ep-27f,  -0x1.cdcf18p-26f,
    -0x1.ee6086p-27f, -0x1.089ef8p-27f};
// tanh(d) = d + d^3 P(d^2) for |d| <= 0.1575, minimax (relative error 2^-32).
constexpr float kTanhP[] = {-0x1.555554p-2f, 0x1.110c7ep-3f, -0x1.b2fafep-5f};

}  // namespace

// x is clamped to [-104, 89], where exp rounds to 0 and inf; results below
// 2^-126 are std::exp in double (kExpDenormal).
void Exp(const float* x, float* y, int64_t n) {
  ForEachPacket(x, y, n, [](Packet v) {
    const ExpParts e = ExpReduced(ei::pmin(ei::pmax(v, ei::pset1<Packet>(-104.0f)), ei::pset1<Packet>(89.0f)));
    return Pow2Scale(e.hi, e.k);
  }, kExpDenormal, kExpInDouble);
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

// Eigen's float log, a packet at a time: right but for denormal arguments
// (it takes the smallest normal for them), which std::log takes.
void Log(const float* x, float* y, int64_t n) {
  ForEachPacket(
      x, y, n, [](Packet v) { return ei::plog(v); }, std::numeric_limits<float>::min(),
      [](float v) { return std::log(v); });
}

void Log(const double* x, double* y, int64_t n) {
  ForEachBlock(
      x, y, n,
      [](const double* in, double* out, int64_t m) {
        AlignedArray<double>(out, m) = ConstAlignedArray<double>(in, m).log();
      },
      kPositiveNormal, [](double v) { return std::log(v); });
}

void Tanh(const float* x, float* y, int64_t n) {
  ForEachPacket(x, y, n, [](Packet v) {
    // a = |x| = j 5/16 + d, |d| <= 5/32; tanh(a) = (t + u) / (1 + t u) with
    // t = tanh(j 5/16) from a table, u = tanh(d). a is clamped to 9.02: tanh
    // rounds to 1 from 9.011. The sign is x's (tanh(-0) = -0).
    const Packet a = ei::pmin(ei::pabs(v), ei::pset1<Packet>(9.02f));
    const Packet shifter = ei::pset1<Packet>(kRoundShifter);
    const Packet shifted = ei::pmadd(a, ei::pset1<Packet>(1.0f / kTanhStep), shifter);
    const Packet d = ei::pmadd(ei::psub(shifted, shifter), ei::pset1<Packet>(-kTanhStep), a);  // exact
    // u = tanh(d) = d + d3p with d3p = d^3 P(d^2), kept as that sum (d is
    // exact: kTanhStep has 3 bits).
    const Packet d2 = ei::pmul(d, d);
    Packet p = ei::pset1<Packet>(kTanhP[std::size(kTanhP) - 1]);
    for (size_t i = std::size(kTanhP) - 1; i-- > 0;) p = ei::pmadd(p, d2, ei::pset1<Packet>(kTanhP[i]));
    const Packet d3 = ei::pmul(d, d2);
    const Packet d3p = ei::pmul(d3, p);
    const Packet t = Lookup(kTanhHi, shifted);
    const Packet t_lo = Lookup(kTanhLo, shifted);
    // num = t + d + (d3p + t_lo), t + d's rounding error kept (Fast2Sum: t >=
    // |d| unless t = 0).
    const Packet num = ei::padd(t, d);
    const Packet num_lo = ei::padd(ei::padd(ei::psub(t, num), d), ei::pmadd(d3, p, t_lo));
    // den = 1 + (t + t_lo) (d + d3p): 1 + t d's rounding error is exact in
    // an fma; t_lo d3p is below 2^-50.
    const Packet one = ei::pset1<Packet>(1.0f);
    const Packet den = ei::pmadd(t, d, one);
    const Packet den_lo = ei::pmadd(t_lo, d, ei::pmadd(t, d3p, ei::pmadd(t, d, ei::psub(one, den))));
    return ei::por(Divide<false>(num, num_lo, den, den_lo), SignBit(v));
  });
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

void Logistic(const float* x, float* y, int64_t n) {
  ForEachPacket(x, y, n, [](Packet v) {
    // e = exp(-|x|) = (hi + lo) 2^m; the result is num / (1 + e) with num = 1
    // for x >= 0 and e for x < 0, divided as (hi + lo) / (1 + e) and scaled
    // by 2^m last (exactly: results below 2^-126, x < -87.3, are std::exp in
    // double instead).
    const Packet minus_abs = ei::por(v, ei::pset1frombits<Packet>(0x80000000u));
    const ExpParts e = ExpReduced(ei::pmax(minus_abs, ei::pset1<Packet>(-104.0f)));
    const Packet one = ei::pset1<Packet>(1.0f);
    const Packet zero = ei::pzero(v);
    // 2^m, e and 1 + e: where 2^m and e are denormal or 0, 1 + e = 1.
    const Packet scale = Pow2Scale(one, e.k);
    const Packet den = ei::pmadd(e.hi, scale, one);
    const Packet den_lo = ei::pmadd(e.lo, scale, ei::pmadd(e.hi, scale, ei::psub(one, den)));
    const Mask negative = Less(v, zero);
    const Packet q = Divide<true>(Select(negative, e.hi, one), Select(negative, e.lo, zero), den, den_lo);
    return Pow2ScaleWhere(negative, q, e.k);
  }, kExpDenormal, kExpInDouble);  // x < -87.3: logistic(x) = exp(x) in double
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
        if (std::isnan(v)) return v;  // its own NaN (-|v| would set the sign)
        const double e = std::exp(-std::fabs(v));
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
