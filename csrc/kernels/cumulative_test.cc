#include "csrc/kernels/cumulative.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pw::kernels {
namespace {

template <typename T>
std::vector<T> Accumulated(Combiner c, const std::vector<T>& x, int64_t outer, int64_t dim, int64_t inner,
                   bool reverse) {
  std::vector<T> out(x.size() + 2, T(7));  // sentinels after the result show a write past it
  CumulativeRows(c, DTypeOf<T>(), outer, dim, inner, reverse, x.data(), out.data());
  EXPECT_EQ(out[x.size()], T(7));
  EXPECT_EQ(out[x.size() + 1], T(7));
  out.resize(x.size());
  return out;
}

TEST(CumulativeRowsTest, SumsAlongEachAxisPosition) {
  // [outer=2, dim=3, inner=2]
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  EXPECT_EQ(Accumulated(Combiner::kAdd, x, 2, 3, 2, false),
            (std::vector<float>{1, 2, 4, 6, 9, 12, 10, 20, 40, 60, 90, 120}));
  EXPECT_EQ(Accumulated(Combiner::kAdd, x, 2, 3, 2, true),
            (std::vector<float>{9, 12, 8, 10, 5, 6, 90, 120, 80, 100, 50, 60}));
  // The last axis (inner 1) and the first (outer 1).
  EXPECT_EQ(Accumulated(Combiner::kAdd, x, 4, 3, 1, false),
            (std::vector<float>{1, 3, 6, 4, 9, 15, 10, 30, 60, 40, 90, 150}));
  EXPECT_EQ(Accumulated(Combiner::kMul, std::vector<double>{2, 3, 0, 5}, 1, 4, 1, false),
            (std::vector<double>{2, 6, 0, 0}));
  EXPECT_EQ(Accumulated(Combiner::kMul, std::vector<double>{2, 3, 0, 5}, 1, 4, 1, true),
            (std::vector<double>{0, 0, 0, 5}));
}

TEST(CumulativeRowsTest, FloatSumsInOrderAsNumpy) {
  // numpy's cumsum adds in order in float32: 1e8 + 1 + 1 stays 1e8 where a
  // pairwise or reassociated sum would give 100000002.
  const std::vector<float> x = {1e8f, 1, 1, -1e8f};
  const std::vector<float> got = Accumulated(Combiner::kAdd, x, 1, 4, 1, false);
  float running = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    running += x[i];
    EXPECT_EQ(got[i], running);
  }
  EXPECT_EQ(got[2], 1e8f);
  EXPECT_EQ(got[3], 0.0f);
}

TEST(CumulativeRowsTest, MaxMinPropagateNanAndIntsWrap) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto mx = Accumulated(Combiner::kMax, std::vector<float>{1, 3, nan, 5}, 1, 4, 1, false);
  EXPECT_EQ(mx[0], 1);
  EXPECT_EQ(mx[1], 3);
  EXPECT_TRUE(std::isnan(mx[2]) && std::isnan(mx[3]));
  EXPECT_EQ(Accumulated(Combiner::kMin, std::vector<int32_t>{4, 9, -2, 0}, 1, 4, 1, true),
            (std::vector<int32_t>{-2, -2, -2, 0}));
  const int32_t big = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(Accumulated(Combiner::kAdd, std::vector<int32_t>{big, 1}, 1, 2, 1, false),
            (std::vector<int32_t>{big, std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(Accumulated(Combiner::kMul, std::vector<int32_t>{65536, 65536}, 1, 2, 1, false),
            (std::vector<int32_t>{65536, 0}));
  // bool: max is or, min is and.
  EXPECT_EQ(Accumulated(Combiner::kMax, std::vector<uint8_t>{0, 1, 0}, 1, 3, 1, false),
            (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(Accumulated(Combiner::kMin, std::vector<uint8_t>{1, 0, 1}, 1, 3, 1, false),
            (std::vector<uint8_t>{1, 0, 0}));
}

TEST(CumulativeRowsTest, EmptyAxesWriteNothing) {
  EXPECT_TRUE(Accumulated(Combiner::kAdd, std::vector<float>{}, 3, 0, 2, false).empty());
  EXPECT_TRUE(Accumulated(Combiner::kAdd, std::vector<float>{}, 3, 2, 0, true).empty());
}

// Random values over random [outer, dim, inner], each against a loop written
// out here.
TEST(CumulativeRowsTest, RandomShapesAgainstLoops) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t outer = 1 + rng() % 4, dim = 1 + rng() % 6, inner = 1 + rng() % 5;
    const bool reverse = rng() % 2;
    std::vector<double> x(outer * dim * inner);
    for (double& v : x) v = static_cast<double>(rng() % 1000) / 7 - 70;
    for (Combiner c : {Combiner::kAdd, Combiner::kMul, Combiner::kMax, Combiner::kMin}) {
      const auto got = Accumulated(c, x, outer, dim, inner, reverse);
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          double acc = 0;
          for (int64_t step = 0; step < dim; ++step) {
            const int64_t j = reverse ? dim - 1 - step : step;
            const double v = x[(o * dim + j) * inner + i];
            if (step == 0) {
              acc = v;
            } else if (c == Combiner::kAdd) {
              acc += v;
            } else if (c == Combiner::kMul) {
              acc *= v;
            } else if (c == Combiner::kMax) {
              acc = std::max(acc, v);
            } else {
              acc = std::min(acc, v);
            }
            EXPECT_EQ(got[(o * dim + j) * inner + i], acc);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pw::kernels
