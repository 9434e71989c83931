#include "csrc/kernels/reduction.h"

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

}  // namespace
}  // namespace pw::kernels
