#include "csrc/kernels/sort.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"

namespace pw::kernels {
namespace {

// numpy's sort order, written from the classes rather than the kernel's bit
// trick: numbers by value (-0 == +0), every NaN after +inf and equal to
// every other NaN.
template <typename T>
bool NumpyLess(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

// The reference: each row's positions stably sorted (std::stable_sort), by
// increasing value or, descending, by decreasing value with ties still in
// increasing position.
template <typename T>
std::vector<int32_t> Reference(const std::vector<T>& x, int64_t rows, int64_t n, bool descending) {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    const T* row = x.data() + r * n;
    std::stable_sort(pos.begin(), pos.end(), [&](int32_t a, int32_t b) {
      return descending ? NumpyLess(row[b], row[a]) : NumpyLess(row[a], row[b]);
    });
    out.insert(out.end(), pos.begin(), pos.end());
  }
  return out;
}

template <typename T>
std::vector<int32_t> Sort(const std::vector<T>& x, int64_t rows, int64_t n, bool descending) {
  // Sentinels after the result show a write past it.
  std::vector<int32_t> out(rows * n + 4, -7);
  SortRows(DTypeOf<T>(), rows, n, descending, x.data(), out.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[rows * n + i], -7);
  out.resize(rows * n);
  return out;
}

TEST(SortRowsTest, OrdersFloatsAsNumpy) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // numpy.argsort(kind="stable") of this row, and jax.numpy.argsort(descending=True).
  const std::vector<float> row = {1.0f, nan, 3.0f, -inf, inf, 0.0f, -0.0f, -nan, 3.0f, -0.0f};
  EXPECT_EQ(Sort(row, 1, 10, false), (std::vector<int32_t>{3, 5, 6, 9, 0, 2, 8, 4, 1, 7}));
  EXPECT_EQ(Sort(row, 1, 10, true), (std::vector<int32_t>{1, 7, 4, 2, 8, 0, 5, 6, 9, 3}));
  const std::vector<double> row64(row.begin(), row.end());
  EXPECT_EQ(Sort(row64, 1, 10, false), Sort(row, 1, 10, false));
  EXPECT_EQ(Sort(row64, 1, 10, true), Sort(row, 1, 10, true));
}

TEST(SortRowsTest, IntegersBoolsAndExtremes) {
  const std::vector<int32_t> ints = {3, std::numeric_limits<int32_t>::min(), -1, 3,
                                     std::numeric_limits<int32_t>::max(), 0};
  EXPECT_EQ(Sort(ints, 1, 6, false), (std::vector<int32_t>{1, 2, 5, 0, 3, 4}));
  EXPECT_EQ(Sort(ints, 1, 6, true), (std::vector<int32_t>{4, 0, 3, 5, 2, 1}));
  // uint32 above 2^31 sorts after every smaller value (not as a negative int32).
  const std::vector<uint32_t> uints = {5, 0x80000003u, 0, 7, 0xffffffffu, 7};
  EXPECT_EQ(Sort(uints, 1, 6, false), (std::vector<int32_t>{2, 0, 3, 5, 1, 4}));
  EXPECT_EQ(Sort(uints, 1, 6, true), (std::vector<int32_t>{4, 1, 3, 5, 0, 2}));
  EXPECT_EQ(Sort(uints, 1, 6, false), Reference(uints, 1, 6, false));
  const std::vector<uint8_t> bools = {1, 0, 1, 0, 0};
  EXPECT_EQ(Sort(bools, 1, 5, false), (std::vector<int32_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(Sort(bools, 1, 5, true), (std::vector<int32_t>{0, 2, 1, 3, 4}));
}

TEST(SortRowsTest, EmptyAndOneElementRows) {
  EXPECT_TRUE(Sort(std::vector<float>{}, 3, 0, false).empty());
  EXPECT_TRUE(Sort(std::vector<float>{}, 0, 5, true).empty());
  EXPECT_EQ(Sort(std::vector<float>{2, 1, 0}, 3, 1, false), (std::vector<int32_t>{0, 0, 0}));
}

// Many rows of values from a small set (ties everywhere) with NaN, infinities
// and both zeros mixed in, against the stable reference; rows sorted
// independently.
template <typename T>
void CheckRandomRows(bool descending) {
  std::mt19937 rng(7);
  for (int64_t n : {2, 3, 17, 64, 1000}) {
    const int64_t rows = 5;
    std::vector<T> x(rows * n);
    for (T& v : x) {
      const int r = static_cast<int>(rng() % 12);
      if constexpr (std::is_floating_point_v<T>) {
        const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                              std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                              T(0), -T(0)};
        v = r < 6 ? specials[r] : static_cast<T>(r) / 4;
      } else if constexpr (std::is_same_v<T, uint8_t>) {
        v = static_cast<uint8_t>(r % 2);
      } else {
        v = static_cast<T>(r) - 6;
      }
    }
    EXPECT_EQ(Sort(x, rows, n, descending), Reference(x, rows, n, descending)) << "n=" << n;
  }
}

TEST(SortRowsTest, RandomRowsAscending) {
  CheckRandomRows<float>(false);
  CheckRandomRows<double>(false);
  CheckRandomRows<int32_t>(false);
  CheckRandomRows<uint8_t>(false);
}

TEST(SortRowsTest, RandomRowsDescending) {
  CheckRandomRows<float>(true);
  CheckRandomRows<double>(true);
  CheckRandomRows<int32_t>(true);
  CheckRandomRows<uint8_t>(true);
}

}  // namespace
}  // namespace pw::kernels
