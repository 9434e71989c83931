#include "csrc/kernels/top_k.h"

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

// IEEE totalOrder, written from the classes rather than the kernel's bit
// trick: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN (NaNs of one sign
// equal; the tests use one NaN of each sign).
template <typename T>
bool TotalLess(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    auto rank = [](T v) { return std::isnan(v) ? (std::signbit(v) ? -1 : 1) : 0; };
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (rank(a) != 0) return false;
    if (a == b) return std::signbit(a) && !std::signbit(b);  // -0 < +0
    return a < b;
  } else {
    return a < b;
  }
}

// The reference: each row's positions stably sorted by decreasing value,
// the first k.
template <typename T>
std::vector<int32_t> Reference(const std::vector<T>& x, int64_t rows, int64_t n, int64_t k) {
  std::vector<int32_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    const T* row = x.data() + r * n;
    std::stable_sort(pos.begin(), pos.end(),
                     [&](int32_t a, int32_t b) { return TotalLess(row[b], row[a]); });
    out.insert(out.end(), pos.begin(), pos.begin() + k);
  }
  return out;
}

template <typename T>
std::vector<int32_t> TopK(const std::vector<T>& x, int64_t rows, int64_t n, int64_t k) {
  // Sentinels after the result show a write past it.
  std::vector<int32_t> out(rows * k + 4, -7);
  TopKRows(DTypeOf<T>(), rows, n, k, x.data(), out.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[rows * k + i], -7);
  out.resize(rows * k);
  return out;
}

TEST(TopKRowsTest, OrdersFloatsAsXla) {
  // jax.lax.top_k (XLA's TopK) of this row gives these positions.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.f, nan, 3.f, -inf, inf, 0.f, -0.f, -nan, 3.f};
  EXPECT_EQ(TopK(x, 1, 9, 9), (std::vector<int32_t>{1, 4, 2, 8, 0, 5, 6, 3, 7}));
  EXPECT_EQ(TopK(x, 1, 9, 3), (std::vector<int32_t>{1, 4, 2}));
  const double dnan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> y = {1., dnan, -dnan, 0., -0.};
  EXPECT_EQ(TopK(y, 1, 5, 5), (std::vector<int32_t>{1, 0, 3, 4, 2}));
}

TEST(TopKRowsTest, TiesGoToTheLowerPosition) {
  const std::vector<int32_t> x = {3, 1, 3, 2, 3, 3, 1};
  EXPECT_EQ(TopK(x, 1, 7, 3), (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(TopK(x, 1, 7, 7), (std::vector<int32_t>{0, 2, 4, 5, 3, 1, 6}));
  const std::vector<float> same(50, 0.5f);
  std::vector<int32_t> first(10);
  std::iota(first.begin(), first.end(), 0);
  EXPECT_EQ(TopK(same, 1, 50, 10), first);
  const std::vector<uint8_t> bools = {0, 1, 0, 1, 1};
  EXPECT_EQ(TopK(bools, 1, 5, 4), (std::vector<int32_t>{1, 3, 4, 0}));
}

TEST(TopKRowsTest, IntegerExtremesAndEdgeSizes) {
  const int32_t lo = std::numeric_limits<int32_t>::min();
  const int32_t hi = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(TopK(std::vector<int32_t>{hi, lo, 0}, 1, 3, 3), (std::vector<int32_t>{0, 2, 1}));
  // k = 0 writes nothing; rows of one element; no rows.
  EXPECT_EQ(TopK(std::vector<float>{1.f, 2.f}, 2, 1, 0), (std::vector<int32_t>{}));
  EXPECT_EQ(TopK(std::vector<float>{1.f, 2.f}, 2, 1, 1), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(TopK(std::vector<float>{}, 0, 4, 2), (std::vector<int32_t>{}));
}

// Rows in increasing order (every element displaces the worst kept one),
// decreasing order (none does), and random rows with many ties and the
// float specials, against the stable sort, for several k per row length.
template <typename T>
void CheckAgainstStableSort() {
  std::mt19937 rng(11);
  for (int64_t n : {1, 2, 3, 7, 16, 100, 1000}) {
    std::vector<int64_t> ks = {0, 1, 2, n / 2, n - 1, n};
    for (int64_t k : ks) {
      if (k < 0 || k > n) continue;
      SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k);
      const int64_t rows = 3;
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<T> x(rows * n);
        for (int64_t i = 0; i < rows * n; ++i) {
          const int64_t j = i % n;
          if (pattern == 0) {
            x[i] = static_cast<T>(std::is_same_v<T, uint8_t> ? j * 2 / std::max<int64_t>(n, 1) : j);
          } else if (pattern == 1) {
            x[i] = static_cast<T>(std::is_same_v<T, uint8_t> ? j < n / 2 : n - j);
          } else {
            // A few distinct values, so most elements tie with others.
            const int v = static_cast<int>(rng() % 9) - 4;
            x[i] = static_cast<T>(std::is_same_v<T, uint8_t> ? v > 0 : v);
            if constexpr (std::is_floating_point_v<T>) {
              switch (rng() % 16) {
                case 0: x[i] = std::numeric_limits<T>::quiet_NaN(); break;
                case 1: x[i] = -std::numeric_limits<T>::quiet_NaN(); break;
                case 2: x[i] = std::numeric_limits<T>::infinity(); break;
                case 3: x[i] = -std::numeric_limits<T>::infinity(); break;
                case 4: x[i] = T(-0.0); break;
                case 5: x[i] = T(0.0); break;
                default: break;
              }
            }
          }
        }
        EXPECT_EQ(TopK(x, rows, n, k), Reference(x, rows, n, k)) << "pattern " << pattern;
      }
    }
  }
}

TEST(TopKRowsTest, MatchesAStableSortF32) { CheckAgainstStableSort<float>(); }
TEST(TopKRowsTest, MatchesAStableSortF64) { CheckAgainstStableSort<double>(); }
TEST(TopKRowsTest, MatchesAStableSortI32) { CheckAgainstStableSort<int32_t>(); }
// uint32 ranks unsigned: the negative patterns wrap to the largest values.
TEST(TopKRowsTest, MatchesAStableSortU32) { CheckAgainstStableSort<uint32_t>(); }
TEST(TopKRowsTest, MatchesAStableSortBool) { CheckAgainstStableSort<uint8_t>(); }

}  // namespace
}  // namespace pw::kernels
