#include "csrc/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

// Accuracy is measured in ulp of the result against the exact value,
// computed in double for float and in long double for double. The bounds
// asserted here are the ones vector_math.h promises. The float sweep visits
// every 509th bit pattern by default (8.4 million inputs) plus every float
// in the ranges where results turn denormal or overflow;
// PW_VECTOR_MATH_EXHAUSTIVE=1 visits all 2^32 (minutes per function).

namespace pw {
namespace {

// Higher precision for the reference of T.
template <typename T>
using Wide = std::conditional_t<std::is_same_v<T, float>, double, long double>;

template <typename T>
using ArrayFn = void (*)(const T*, T*, int64_t);

// Error of y in ulp of the exact value r. The ulp of a result is the spacing
// of T at r's binade (denormals: the smallest denormal). A NaN, or a result
// that is infinite in T, must be matched exactly (infinite error otherwise).
template <typename T>
double UlpError(T y, Wide<T> r) {
  using W = Wide<T>;
  if (std::isnan(r) || std::isnan(y)) {
    return std::isnan(r) && std::isnan(y) ? 0 : INFINITY;
  }
  const T rounded = static_cast<T>(r);
  if (std::isinf(rounded) || std::isinf(y)) return rounded == y ? 0 : INFINITY;
  int exponent = 0;
  std::frexp(std::fabs(rounded), &exponent);  // |rounded| in [2^(exponent-1), 2^exponent)
  constexpr int kDigits = std::numeric_limits<T>::digits;
  constexpr int kMinExponent = std::numeric_limits<T>::min_exponent;  // FLT_MIN = 2^(min_exponent-1)
  const int ulp_exponent = std::max(exponent, kMinExponent) - kDigits;
  return static_cast<double>(std::fabs(W{y} - r) / std::ldexp(W{1}, ulp_exponent));
}

template <typename W>
W ExactLogistic(W x) {
  if (x < 0) {
    const W e = std::exp(x);
    return e / (1 + e);
  }
  return 1 / (1 + std::exp(-x));
}

// One function of vector_math.h for both types, its exact value and the
// error bounds promised in vector_math.h.
struct Function {
  std::string name;
  ArrayFn<float> f32;
  ArrayFn<double> f64;
  double (*exact32)(double);
  long double (*exact64)(long double);
  double bound32;
  double bound64;
};

// Eigen's float log, sin and cos, and our float exp, tanh and logistic, are
// a little less accurate without fused multiply-add (the portable x86-64
// build, SSE2). This test is compiled with the kernels library's instruction
// set (CMakeLists.txt).
#ifdef __FMA__
constexpr bool kFma = true;
#else
constexpr bool kFma = false;
#endif

const std::vector<Function>& Functions() {
  static const auto* functions = new std::vector<Function>{
      {"exp", Exp, Exp, [](double x) { return std::exp(x); }, [](long double x) { return std::exp(x); },
       kFma ? 0.58 : 0.60, 2},
      {"log", Log, Log, [](double x) { return std::log(x); }, [](long double x) { return std::log(x); },
       kFma ? 0.91 : 1.07, 2},
      {"tanh", Tanh, Tanh, [](double x) { return std::tanh(x); },
       [](long double x) { return std::tanh(x); }, kFma ? 0.55 : 0.65, 2.5},
      {"sin", Sin, Sin, [](double x) { return std::sin(x); }, [](long double x) { return std::sin(x); },
       kFma ? 1.51 : 2.43, 1},
      {"cos", Cos, Cos, [](double x) { return std::cos(x); }, [](long double x) { return std::cos(x); },
       kFma ? 1.51 : 2.43, 1},
      {"sqrt", Sqrt, Sqrt, [](double x) { return std::sqrt(x); },
       [](long double x) { return std::sqrt(x); }, 0.5, 0.5},
      {"rsqrt", Rsqrt, Rsqrt, [](double x) { return 1 / std::sqrt(x); },
       [](long double x) { return 1 / std::sqrt(x); }, 0.501, 1.5},
      {"logistic", Logistic, Logistic, ExactLogistic<double>, ExactLogistic<long double>,
       kFma ? 0.58 : 0.59, 3},
      {"erf", Erf, Erf, [](double x) { return std::erf(x); }, [](long double x) { return std::erf(x); },
       0.501, 1},
      {"erfc", Erfc, Erfc, [](double x) { return std::erfc(x); },
       [](long double x) { return std::erfc(x); }, 0.501, 2.5},
  };
  return *functions;
}

template <typename T>
ArrayFn<T> Fn(const Function& f) {
  if constexpr (std::is_same_v<T, float>) {
    return f.f32;
  } else {
    return f.f64;
  }
}

template <typename T>
Wide<T> Exact(const Function& f, T x) {
  if constexpr (std::is_same_v<T, float>) {
    return f.exact32(x);
  } else {
    return f.exact64(x);
  }
}

template <typename T>
double Bound(const Function& f) {
  if constexpr (std::is_same_v<T, float>) {
    return f.bound32;
  } else {
    return f.bound64;
  }
}

// The largest error of f over some inputs, and where.
struct Worst {
  double ulp = 0;
  double x = 0;
  double y = 0;
  int64_t count = 0;
};

// Runs f on `xs` (in one call) and folds the errors into `worst`.
template <typename T>
void Measure(const Function& f, const std::vector<T>& xs, Worst& worst) {
  std::vector<T> ys(xs.size());
  Fn<T>(f)(xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double e = UlpError<T>(ys[i], Exact<T>(f, xs[i]));
    if (!(e <= worst.ulp)) worst = {e, double{xs[i]}, double{ys[i]}, worst.count};
  }
  worst.count += static_cast<int64_t>(xs.size());
}

template <typename T>
void ExpectWithinBound(const Function& f, const Worst& worst, const std::string& inputs) {
  std::printf("%-8s %-6s max %.6f ulp over %lld %s inputs (at x = %.17g, got %.17g)\n",
              f.name.c_str(), sizeof(T) == 4 ? "float" : "double", worst.ulp,
              static_cast<long long>(worst.count), inputs.c_str(), worst.x, worst.y);
  EXPECT_LE(worst.ulp, Bound<T>(f)) << f.name << " at x = " << worst.x << " gave " << worst.y;
}

float FloatFromBits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

TEST(VectorMathTest, FloatBitPatternSweep) {
  const bool exhaustive = std::getenv("PW_VECTOR_MATH_EXHAUSTIVE") != nullptr;
  const uint64_t stride = exhaustive ? 1 : 509;
  constexpr size_t kChunk = 1 << 20;
  for (const Function& f : Functions()) {
    Worst worst;
    std::vector<float> xs;
    xs.reserve(kChunk);
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += stride) {
      xs.push_back(FloatFromBits(static_cast<uint32_t>(bits)));
      if (xs.size() == kChunk) {
        Measure(f, xs, worst);
        xs.clear();
      }
    }
    Measure(f, xs, worst);
    ExpectWithinBound<float>(f, worst, exhaustive ? "(all) float" : "float bit-pattern");
  }
}

// Every float in [lo, hi].
std::vector<float> AllFloats(float lo, float hi) {
  std::vector<float> xs;
  for (float x = lo; x <= hi; x = std::nextafter(x, INFINITY)) xs.push_back(x);
  return xs;
}

TEST(VectorMathTest, FloatDenseRanges) {
  struct Range {
    std::string function;
    float lo, hi;
  };
  // At most a few binades each (every float of [-1, 1] would be 2^31).
  const std::vector<Range> ranges = {
      // Results turning denormal, then zero; overflow.
      {"exp", -105.0f, -87.0f},
      {"exp", 88.0f, 89.0f},
      {"logistic", -105.0f, -87.0f},
      {"logistic", -10.0f, -8.0f},
      // Arguments near 1; denormal arguments.
      {"log", 0.5f, 2.0f},
      {"log", 0.0f, 2.0e-38f},
      // Float tanh: across its table's first steps (at 5/32 and 15/32);
      // saturation (to 1 from 9.011).
      {"tanh", 0.125f, 0.5f},
      {"tanh", 8.0f, 10.0f},
      {"sin", 1.0f, 4.0f},
      {"cos", 1.0f, 4.0f},
      {"sin", 1.0e4f, 1.01e4f},
      {"cos", 1.0e4f, 1.01e4f},
      {"sqrt", 0.0f, 2.0e-38f},
      {"sqrt", 1.0f, 4.0f},
      {"rsqrt", 0.0f, 2.0e-38f},
      {"rsqrt", 1.0f, 4.0f},
      // erf and erfc: around their cut-overs (0.47, 0.85), where erfc turns
      // denormal (9.2) and zero (10.05), and near 0.
      {"erf", 0.4f, 1.2f},
      {"erf", -1.2f, -0.4f},
      {"erfc", 0.4f, 1.2f},
      {"erfc", -1.2f, -0.4f},
      {"erfc", 8.0f, 10.1f},
      {"erf", 0x1p-14f, 0x1p-10f},
  };
  for (const Range& range : ranges) {
    for (const Function& f : Functions()) {
      if (f.name != range.function) continue;
      Worst worst;
      Measure(f, AllFloats(range.lo, range.hi), worst);
      char inputs[64];
      std::snprintf(inputs, sizeof inputs, "float in [%g, %g]", range.lo, range.hi);
      ExpectWithinBound<float>(f, worst, inputs);
    }
  }
}

TEST(VectorMathTest, DoubleRandom) {
  std::mt19937_64 rng(42);
  constexpr int kCount = 1 << 20;
  for (const Function& f : Functions()) {
    // Random bit patterns (every binade alike), then uniform in the ranges
    // where the function is most used or turns denormal.
    std::vector<std::pair<double, double>> ranges = {{-1, 1}, {-20, 20}};
    if (f.name == "exp" || f.name == "logistic") ranges.push_back({-746, 710});
    if (f.name == "sin" || f.name == "cos") ranges.push_back({-1e6, 1e6});
    if (f.name == "log" || f.name == "sqrt" || f.name == "rsqrt") ranges.push_back({0, 1e-300});
    if (f.name == "erf" || f.name == "erfc") ranges.push_back({-6, 6});
    if (f.name == "erfc") ranges.push_back({0, 27.5});  // erfc turns denormal near 26.55
    Worst worst;
    std::vector<double> xs(kCount);
    for (double& x : xs) {
      const uint64_t bits = rng();
      std::memcpy(&x, &bits, sizeof x);
    }
    Measure(f, xs, worst);
    for (auto [lo, hi] : ranges) {
      std::uniform_real_distribution<double> uniform(lo, hi);
      for (double& x : xs) x = uniform(rng);
      Measure(f, xs, worst);
    }
    ExpectWithinBound<double>(f, worst, "random double");
  }
}

// ±0, ±inf, NaN, denormals, extremes and where results overflow or
// underflow: within the bound, and wherever the exact result is NaN, an
// infinity or a zero, exactly that (with its sign).
template <typename T>
void CheckSpecialValues() {
  using L = std::numeric_limits<T>;
  std::vector<T> xs = {0, -T{0}, L::infinity(), -L::infinity(), L::quiet_NaN(), -L::quiet_NaN(),
                       L::denorm_min(), -L::denorm_min(), L::min(), -L::min(), L::min() / 3,
                       L::max(), -L::max(), L::epsilon(), 1, -1, 0.5, 2, 1e-5, -1e-5, 1e-30,
                       1e30, -1e30, 1e38, 3e38, -3e38};
  // exp and logistic: results around the overflow and denormal boundaries.
  for (T v : {88.7, 88.72, 88.73, 89.0, -87.3, -87.34, -88.0, -95.0, -103.0, -103.97, -104.0,
              -110.0, 709.0, 709.78, 709.79, -708.0, -708.4, -709.0, -720.0, -744.0, -745.1,
              -746.0, -1000.0, 1000.0}) {
    xs.push_back(v);
  }
  for (T v : {9.0, 9.1, 10.0, 20.0, 100.0}) {  // tanh saturating
    xs.push_back(v);
    xs.push_back(-v);
  }
  for (const Function& f : Functions()) {
    std::vector<T> ys(xs.size());
    Fn<T>(f)(xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
    for (size_t i = 0; i < xs.size(); ++i) {
      const auto exact = Exact<T>(f, xs[i]);
      const T rounded = static_cast<T>(exact);
      SCOPED_TRACE(f.name + "(" + std::to_string(xs[i]) + ") = " + std::to_string(ys[i]) +
                   ", exact " + std::to_string(exact));
      EXPECT_LE(UlpError<T>(ys[i], exact), Bound<T>(f));
      if (std::isnan(xs[i])) {
        // A NaN argument's own NaN, sign kept, as std:: and numpy give it.
        EXPECT_TRUE(std::isnan(ys[i]));
        EXPECT_EQ(std::signbit(ys[i]), std::signbit(xs[i]));
      } else if (std::isnan(rounded)) {
        EXPECT_TRUE(std::isnan(ys[i]));
      } else if (std::isinf(rounded) || rounded == 0) {
        EXPECT_EQ(ys[i], rounded);
        EXPECT_EQ(std::signbit(ys[i]), std::signbit(rounded));
      }
    }
  }
}

TEST(VectorMathTest, SpecialValuesFloat) { CheckSpecialValues<float>(); }
TEST(VectorMathTest, SpecialValuesDouble) { CheckSpecialValues<double>(); }

TEST(VectorMathTest, NamedCases) {
  auto one = [](ArrayFn<float> f, float x) {
    float y;
    f(&x, &y, 1);
    return y;
  };
  auto one64 = [](ArrayFn<double> f, double x) {
    double y;
    f(&x, &y, 1);
    return y;
  };
  EXPECT_EQ(one(Exp, -104.0f), 0.0f);  // exact 6.8e-46, below half the smallest denormal
  EXPECT_EQ(one(Exp, -103.0f), std::exp(-103.0f));
  EXPECT_EQ(one(Exp, -100.0f), std::exp(-100.0f));  // a denormal
  EXPECT_EQ(one(Exp, 88.7f), std::exp(88.7f));      // finite
  EXPECT_EQ(one(Exp, 88.8f), INFINITY);
  EXPECT_EQ(one64(Exp, -740.0), std::exp(-740.0));  // a denormal
  EXPECT_EQ(one64(Exp, 709.78), std::exp(709.78));
  EXPECT_EQ(one(Log, 1e-40f), std::log(1e-40f));
  EXPECT_EQ(one64(Log, 1e-310), std::log(1e-310));
  EXPECT_TRUE(std::isnan(one(Log, -1.0f)));
  EXPECT_EQ(one(Log, 0.0f), -INFINITY);
  EXPECT_EQ(one(Log, -0.0f), -INFINITY);
  EXPECT_EQ(one(Tanh, 1e30f), 1.0f);
  EXPECT_EQ(one(Tanh, -20.0f), -1.0f);
  EXPECT_EQ(one(Rsqrt, 0.0f), INFINITY);
  EXPECT_EQ(one64(Rsqrt, 0.0), INFINITY);
  EXPECT_EQ(one(Rsqrt, INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(one(Sqrt, -1.0f)));
  EXPECT_EQ(one(Sqrt, INFINITY), INFINITY);
  EXPECT_NEAR(one(Sin, 1e30f), std::sin(double{1e30f}), 1e-7);
  EXPECT_NEAR(one(Cos, 1e30f), std::cos(double{1e30f}), 1e-7);
  EXPECT_TRUE(std::isnan(one(Sin, INFINITY)));
  EXPECT_EQ(one(Logistic, -120.0f), 0.0f);
  EXPECT_EQ(one(Logistic, 30.0f), 1.0f);
  EXPECT_EQ(one(Logistic, -0.0f), 0.5f);
  EXPECT_EQ(one(Logistic, -100.0f), static_cast<float>(std::exp(-100.0)));  // a denormal
  EXPECT_TRUE(std::signbit(one(Tanh, -0.0f)));
  EXPECT_EQ(one(Tanh, 9.0f), static_cast<float>(std::tanh(9.0)));  // 1 - 2^-24
  EXPECT_EQ(one(Tanh, 9.02f), 1.0f);
  EXPECT_EQ(one(Tanh, -INFINITY), -1.0f);
  // erf: odd, saturating to exactly +-1; erfc: 2 at -inf, 0 from 10.06 (float)
  // and 27.3 (double), denormal just before.
  EXPECT_EQ(one64(Erf, 6.0), 1.0);
  EXPECT_EQ(one64(Erf, -INFINITY), -1.0);
  EXPECT_EQ(one(Erf, 4.0f), 1.0f);
  EXPECT_TRUE(std::signbit(one(Erf, -0.0f)));
  EXPECT_EQ(one64(Erf, -0.3), -one64(Erf, 0.3));
  EXPECT_EQ(one64(Erfc, -INFINITY), 2.0);
  EXPECT_EQ(one64(Erfc, INFINITY), 0.0);
  EXPECT_EQ(one64(Erfc, 30.0), 0.0);
  EXPECT_GT(one64(Erfc, 26.9), 0.0);
  EXPECT_LT(one64(Erfc, 26.9), std::numeric_limits<double>::min());
  EXPECT_EQ(one(Erfc, 10.1f), 0.0f);
  EXPECT_GT(one(Erfc, 9.5f), 0.0f);
  EXPECT_TRUE(std::isnan(one(Erfc, NAN)));
  EXPECT_TRUE(std::isnan(one64(Erf, -NAN)));
}

// In place, out of place, and one element at a time, at any length and
// offset, give the same bits: results depend only on the input value.
template <typename T>
void CheckLengthsAndAliasing() {
  std::mt19937 rng(7);
  for (int64_t n : {0, 1, 7, 600, 1000003}) {
    std::vector<T> xs(n + 1);
    std::uniform_real_distribution<T> uniform(-30, 30);
    for (T& x : xs) x = uniform(rng);
    if (n > 100) {  // a few elements that take the std:: fallback
      xs[3] = std::numeric_limits<T>::quiet_NaN();
      xs[n / 3] = -100;  // float exp and logistic: a denormal
      xs[n / 2] = -std::numeric_limits<T>::denorm_min();
      xs[n - 2] = -95;
      xs[n - 1] = std::numeric_limits<T>::infinity();
    }
    for (const Function& f : Functions()) {
      SCOPED_TRACE(f.name + " n=" + std::to_string(n));
      const ArrayFn<T> fn = Fn<T>(f);
      std::vector<T> out(n + 2, T{-7});
      fn(xs.data(), out.data(), n);
      EXPECT_EQ(out[n], T{-7}) << "wrote past the end";
      std::vector<T> shifted(n + 2, T{-7});  // other alignments of x and y
      fn(xs.data() + 1, shifted.data() + 1, n);
      std::vector<T> in_place(xs.begin(), xs.begin() + n);
      fn(in_place.data(), in_place.data(), n);
      for (int64_t i = 0; i < n; i += (n > 1000 ? 997 : 1)) {
        T single;
        fn(&xs[i], &single, 1);
        ASSERT_EQ(std::memcmp(&out[i], &single, sizeof(T)), 0) << "element " << i;
        ASSERT_EQ(std::memcmp(&in_place[i], &single, sizeof(T)), 0) << "element " << i;
      }
      for (int64_t i = 0; i + 1 < n; i += (n > 1000 ? 997 : 1)) {
        T single;
        fn(&xs[i + 1], &single, 1);
        ASSERT_EQ(std::memcmp(&shifted[i + 1], &single, sizeof(T)), 0) << "element " << i + 1;
      }
      if (n > 0) {  // memcmp of a null pointer is undefined, even for 0 bytes
        EXPECT_EQ(std::memcmp(in_place.data(), out.data(), n * sizeof(T)), 0);
      }
    }
  }
}

TEST(VectorMathTest, LengthsAndAliasingFloat) { CheckLengthsAndAliasing<float>(); }
TEST(VectorMathTest, LengthsAndAliasingDouble) { CheckLengthsAndAliasing<double>(); }

}  // namespace
}  // namespace pw
