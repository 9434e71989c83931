#include "csrc/kernels/reduction.h"

#include <cstring>
#include <limits>

#include "csrc/kernels/scalar_ops.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace pw::kernels {
namespace {

// Every reduction over every subset of axes of shapes up to rank 4 (size-1
// dims included, so the fast paths' dimension merging is exercised): the
// fast path gives the general loop's result. Max, min and integer sums are
// exact; float sums add pairwise on the fast path, so they agree within a
// few ulp of the sum of magnitudes.
template <typename T>
void CheckFastPathsMatchTheGeneralLoop() {
  std::mt19937 rng(7);
  const std::vector<Dims> shapes = {{5},       {1, 7},     {6, 1},       {3, 4},      {4, 130},
                                    {2, 3, 4}, {3, 1, 5},  {2, 300, 3},  {2, 3, 4, 5}, {1, 2, 1, 9}};
  int fast = 0;
  for (const Dims& dims : shapes) {
    const int rank = static_cast<int>(dims.size());
    int64_t size = 1;
    for (int64_t d : dims) size *= d;
    std::vector<T> x(static_cast<size_t>(size * 2));  // two shards
    std::uniform_int_distribution<int> dist(-50, 50);
    for (T& v : x) v = static_cast<T>(dist(rng)) / (std::is_floating_point_v<T> ? T(8) : T(1));
    for (int mask = 0; mask < (1 << rank); ++mask) {
      std::vector<int64_t> axes;
      int64_t n = 1;
      for (int d = 0; d < rank; ++d) {
        if (mask & (1 << d)) {
          axes.push_back(d);
        } else {
          n *= dims[d];
        }
      }
      const ReducePlan plan = MakeReducePlan(dims, axes);
      ReducePlan general = plan;
      general.layout = ReducePlan::Layout::kGeneral;
      fast += plan.layout != ReducePlan::Layout::kGeneral ? 1 : 0;
      for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean, ReduceKind::kMax, ReduceKind::kMin}) {
        if (kind == ReduceKind::kMean && !std::is_floating_point_v<T>) continue;
        SCOPED_TRACE(absl::StrCat("dims [", absl::StrJoin(dims, ","), "] axes [",
                                  absl::StrJoin(axes, ","), "] ", ReduceKindName(kind)));
        std::vector<T> got(static_cast<size_t>(n * 2)), want(static_cast<size_t>(n * 2));
        const View view{x.data(), size, 1};
        RunReduce(kind, DTypeOf<T>(), 2, n, view, plan, got.data());
        RunReduce(kind, DTypeOf<T>(), 2, n, view, general, want.data());
        for (size_t i = 0; i < got.size(); ++i) {
          if constexpr (std::is_floating_point_v<T>) {
            EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
          } else {
            EXPECT_EQ(got[i], want[i]) << i;
          }
        }
      }
    }
  }
  EXPECT_GT(fast, 40);  // most of these take a fast path
}

TEST(ReductionTest, FastPathsMatchTheGeneralLoopF32) { CheckFastPathsMatchTheGeneralLoop<float>(); }
TEST(ReductionTest, FastPathsMatchTheGeneralLoopF64) { CheckFastPathsMatchTheGeneralLoop<double>(); }
TEST(ReductionTest, FastPathsMatchTheGeneralLoopI32) { CheckFastPathsMatchTheGeneralLoop<int32_t>(); }
TEST(ReductionTest, FastPathsMatchTheGeneralLoopU32) { CheckFastPathsMatchTheGeneralLoop<uint32_t>(); }

TEST(ReductionTest, Layouts) {
  EXPECT_EQ(MakeReducePlan({4, 8}, std::vector<int64_t>{1}).layout, ReducePlan::Layout::kRows);
  EXPECT_EQ(MakeReducePlan({4, 8}, std::vector<int64_t>{0}).layout, ReducePlan::Layout::kColumns);
  const ReducePlan middle = MakeReducePlan({2, 3, 4}, std::vector<int64_t>{1});
  EXPECT_EQ(middle.layout, ReducePlan::Layout::kColumns);
  EXPECT_EQ(middle.outer, 2);
  EXPECT_EQ(middle.inner, 4);
  EXPECT_EQ(MakeReducePlan({2, 3, 4}, std::vector<int64_t>{0, 2}).layout,
            ReducePlan::Layout::kGeneral);
}

// The pairwise sum of many float32 terms stays accurate where one running
// sum stalls: past 2^24, adding 1 to a float32 changes nothing.
TEST(ReductionTest, PairwiseSumIsAccurate) {
  const int64_t n = int64_t{1} << 25;
  std::vector<float> ones(static_cast<size_t>(n), 1.f);
  float out = 0;
  const ReducePlan plan = MakeReducePlan({n}, std::vector<int64_t>{0});
  RunReduce(ReduceKind::kSum, DType::kF32, 1, 1, View{ones.data(), n, 1}, plan, &out);
  EXPECT_EQ(out, static_cast<float>(n));  // a running sum gives 2^24
}

// RunMax (running extremes in lanes) gives the in-order fold's bits: with
// NaNs anywhere, signed zeros as the extreme, ties, and every length.
template <typename T>
void ExpectRunMaxIsInOrder() {
  std::mt19937 rng(7);
  const T specials[] = {T(0), -T(0), std::numeric_limits<T>::quiet_NaN(),
                        -std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), T(1), T(-1)};
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t n = 1 + rng() % 70;
    std::vector<T> x(static_cast<size_t>(n));
    const int mode = trial % 4;  // random; all <= 0 with zeros; a special here and there; all zeros
    for (T& v : x) {
      if (mode == 3) v = rng() % 2 ? T(0) : -T(0);
      else if (mode == 2 && rng() % 8 == 0) v = specials[rng() % 8];
      else v = T(static_cast<double>(rng() % 1000) - (mode == 1 ? 1000.0 : 500.0)) / T(8);
    }
    if (mode == 1) x[rng() % n] = rng() % 2 ? T(0) : -T(0);
    for (bool max : {true, false}) {
      const T fast = RunMax(x.data(), n, max);
      const T slow = RunMaxInOrder(x.data(), n, max);
      EXPECT_EQ(std::memcmp(&fast, &slow, sizeof(T)), 0)
          << "trial " << trial << " n " << n << (max ? " max " : " min ") << fast << " vs " << slow;
    }
  }
}

TEST(ReductionTest, RunMaxGivesTheInOrderFoldsBits) {
  ExpectRunMaxIsInOrder<float>();
  ExpectRunMaxIsInOrder<double>();
}

}  // namespace
}  // namespace pw::kernels
