#ifndef PATHWAYS_KERNELS_VECTOR_MATH_H_
#define PATHWAYS_KERNELS_VECTOR_MATH_H_

// Transcendental functions over contiguous arrays, for the elementwise
// kernels and the fused loops' native code: y[i] = f(x[i]) for 0 <= i < n,
// vectorized with Eigen's packet math (AVX-512, AVX2 or SSE2: whatever the
// kernels library is compiled for, see PATHWAYS_NATIVE_ARCH).
//
// Accuracy is part of the contract: results are compared against numpy and
// JAX. The bounds below are the largest errors measured against the exact
// value (computed in double for float, in long double for double), in ulp of
// the result: float on all 2^32 inputs, double on 3 to 4 million random inputs
// per function (every binade alike, and uniform where the function is most
// used); vector_math_test.cc asserts them. "0.5" is correctly rounded;
// "< 0.501" is correctly rounded but for inputs whose exact result lies
// within about 2^-29 ulp of a midpoint between two floats (the function is
// computed in double, then rounded).
//
//              float                         double
//   Exp        < 0.58   (ours; 0.5798)       < 2     (Eigen; 1.70 seen)
//   Log        < 0.91   (Eigen; 0.8999)      < 2     (Eigen; 1.51 seen)
//   Tanh       < 0.55   (ours; 0.5471)       < 2.5   (std::tanh, glibc's: 2.15 seen)
//   Sin, Cos   < 1.51   (Eigen; 1.5011)      < 1     (std::, glibc's: 0.52 seen)
//   Sqrt       0.5      (the instruction)    0.5
//   Rsqrt      < 0.501  (1/sqrt in double)   < 1.5   (1/sqrt, two roundings as numpy's)
//   Logistic   < 0.58   (ours; 0.5772)       < 3     (Eigen; 2.65 seen)
//   Erf        < 0.501  (ours in double)     < 1     (ours; 0.93 seen)
//   Erfc       < 0.501  (ours in double)     < 2.5   (ours; 2.06 seen)
//
// For comparison, numpy 2.4's float32 SIMD functions err by up to 2.4 (exp),
// 3.6 (log), 1.4 (tanh) and 1.5 ulp (sin, cos) on this machine; XLA's are
// similar.
//
// Float exp, tanh and logistic are computed in float (issue 26): the fused
// elementwise loops' native code calls them, and rows such as softmax and
// GELU are meant to run near memory bandwidth. They were computed in double
// for < 0.501 ulp, at 1.4 to 1.9 ns an element (AVX-512, one thread); in
// float, from tables (2^(j/16), tanh(j 5/16)) and short polynomials, with
// the rounding errors of the steps that matter carried along, they cost 0.2
// (exp) and 0.4 ns (tanh, logistic) and stay within 0.58 ulp, within 0.5001
// ulp for 99.9% of inputs: well below numpy's errors. Float log runs Eigen's
// function a packet at a time (0.7 ns, was 0.9; same results).
//
// Without fused multiply-add (the portable x86-64 build: SSE2) Eigen's float
// log errs by up to 1.07 ulp (1.0674), its sin and cos by up to 2.43 ulp
// (2.4221), and our exp, tanh and logistic by up to 0.60 (0.5916), 0.65
// (0.6472) and 0.59 ulp (0.5870), also measured on all 2^32 inputs; the rest
// is as above (vector_math_test.cc asserts the bounds of the build's own
// instruction set). Special values are as std:: gives them, for both types:
// NaN for NaN; ±0, ±inf and denormals in and out; exp overflowing to inf and
// underflowing through the denormals to 0 (exp(-104.f) == 0); log of a
// negative number NaN, of ±0 -inf; tanh(±large) ±1; sin and cos of huge
// arguments reduced exactly, of ±inf NaN; sqrt(-0) == -0; rsqrt(0) == inf,
// rsqrt(-0) == -inf, rsqrt(inf) == 0.
//
// Where Eigen 3.4 falls short, vector_math.cc works around it: float exp,
// tanh and logistic are our own (Eigen's float versions err by up to 4.5,
// 4.8 and 8400 ulp); results the vectorized code would get wrong or round
// twice are recomputed with std:: (float exp and logistic below -87.3, whose
// results are denormal: std::exp in double; Eigen's log of a denormal, its
// double exp and logistic near the denormals, its sin and cos of NaN): rare
// inputs, found by a vectorized test per packet or block, then a scalar loop
// over those elements only. Sqrt and Rsqrt do not use Eigen, whose AVX-512
// sqrt is an estimate. Eigen 3.4 has no vectorized tanh, sin or cos for double:
// those are plain std:: loops.
//
// Results depend only on the input value: not on n, on the element's
// position or on the alignment of x and y (every element takes the same
// vectorized path; the last partial packet or block is padded), so one
// element, a chunk of 256 and a whole array give the same bits.
//
// x and y point to n >= 0 elements; y may be x (in place) but must not
// otherwise overlap it. Thread-safe; meant for executor threads: no heap
// allocation (8 KiB of stack), no locks, no Python.

#include <cstdint>

namespace pw {

void Exp(const float* x, float* y, int64_t n);
void Exp(const double* x, double* y, int64_t n);

// Natural logarithm.
void Log(const float* x, float* y, int64_t n);
void Log(const double* x, double* y, int64_t n);

void Tanh(const float* x, float* y, int64_t n);
void Tanh(const double* x, double* y, int64_t n);

void Sin(const float* x, float* y, int64_t n);
void Sin(const double* x, double* y, int64_t n);

void Cos(const float* x, float* y, int64_t n);
void Cos(const double* x, double* y, int64_t n);

void Sqrt(const float* x, float* y, int64_t n);
void Sqrt(const double* x, double* y, int64_t n);

// 1 / sqrt(x).
void Rsqrt(const float* x, float* y, int64_t n);
void Rsqrt(const double* x, double* y, int64_t n);

// The logistic sigmoid 1 / (1 + exp(-x)); the reference for its accuracy
// (there is no std::logistic) is exp(x) / (1 + exp(x)) for x < 0, else
// 1 / (1 + exp(-x)), in higher precision.
void Logistic(const float* x, float* y, int64_t n);
void Logistic(const double* x, double* y, int64_t n);

// The error function erf(x) = 2 / sqrt(pi) * integral of exp(-t^2) from 0
// to x, and its complement erfc(x) = 1 - erf(x) (accurate where it is tiny:
// erfc(26) = 5.7e-296). Our own approximations (see vector_math.cc and
// derive_erf_coefficients.py), scalar loops (they call std::exp once per
// element at most; about 10 ns an element).
void Erf(const float* x, float* y, int64_t n);
void Erf(const double* x, double* y, int64_t n);
void Erfc(const float* x, float* y, int64_t n);
void Erfc(const double* x, double* y, int64_t n);

}  // namespace pw

#endif  // PATHWAYS_KERNELS_VECTOR_MATH_H_
