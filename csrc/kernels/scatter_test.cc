// ScatterRows (data_movement.h): the kScatter op's kernel.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "csrc/kernels/data_movement.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

template <typename T>
std::vector<T> Scatter(Combiner c, const std::vector<T>& operand, bool scalar, int64_t outer,
                       int64_t dim, int64_t inner, const std::vector<int32_t>& indices,
                       const std::vector<T>& updates) {
  std::vector<T> out(outer * dim * inner + 2, T(9));  // sentinels after the result
  ScatterRows(c, DTypeOf<T>(), outer, dim, inner, operand.data(), scalar, updates.data(),
              indices.data(), static_cast<int64_t>(indices.size()), 1, out.data());
  EXPECT_EQ(out[out.size() - 1], T(9));
  EXPECT_EQ(out[out.size() - 2], T(9));
  out.resize(out.size() - 2);
  return out;
}

TEST(ScatterRowsTest, EachCombinerWithDuplicatesAndDroppedIndices) {
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<int32_t> idx = {2, -1, 2, 4, 0};  // -1 and 4: out of range, skipped
  const std::vector<float> u = {10, 20, 30, 40, 50};
  EXPECT_EQ(Scatter(Combiner::kSet, x, false, 1, 4, 1, idx, u), (std::vector<float>{50, 2, 30, 4}));
  EXPECT_EQ(Scatter(Combiner::kAdd, x, false, 1, 4, 1, idx, u), (std::vector<float>{51, 2, 43, 4}));
  EXPECT_EQ(Scatter(Combiner::kMul, x, false, 1, 4, 1, idx, u), (std::vector<float>{50, 2, 900, 4}));
  EXPECT_EQ(Scatter(Combiner::kMax, x, false, 1, 4, 1, idx, std::vector<float>{0, 0, 2.5, 0, 0}),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Scatter(Combiner::kMin, x, false, 1, 4, 1, idx, std::vector<float>{0, 0, 2.5, 0, 7}),
            (std::vector<float>{1, 2, 0, 4}));
}

TEST(ScatterRowsTest, ScalarOperandRowsAndInnerElements) {
  // [outer=2, dim=3, inner=2] from a zero scalar: rows of updates [2, 2, 2]
  // at indices {1, 1}.
  const std::vector<int32_t> idx = {1, 1};
  const std::vector<int32_t> u = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(Scatter(Combiner::kAdd, std::vector<int32_t>{0}, true, 2, 3, 2, idx, u),
            (std::vector<int32_t>{0, 0, 4, 6, 0, 0, 0, 0, 12, 14, 0, 0}));
  EXPECT_EQ(Scatter(Combiner::kSet, std::vector<int32_t>{-1}, true, 2, 3, 2, idx, u),
            (std::vector<int32_t>{-1, -1, 3, 4, -1, -1, -1, -1, 7, 8, -1, -1}));
}

TEST(ScatterRowsTest, NanIntsAndBools) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto mx = Scatter(Combiner::kMax, std::vector<float>{1, 2}, false, 1, 2, 1, {0, 1},
                          std::vector<float>{nan, 0});
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_EQ(mx[1], 2);
  const int32_t big = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(Scatter(Combiner::kAdd, std::vector<int32_t>{big}, false, 1, 1, 1, {0},
                    std::vector<int32_t>{1}),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(Scatter(Combiner::kMax, std::vector<uint8_t>{0, 1}, false, 1, 2, 1, {0, 1},
                    std::vector<uint8_t>{1, 0}),
            (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(Scatter(Combiner::kMin, std::vector<uint8_t>{1, 1}, false, 1, 2, 1, {0, 0},
                    std::vector<uint8_t>{1, 0}),
            (std::vector<uint8_t>{0, 1}));
}

TEST(ScatterRowsTest, EmptyResultsAndNoIndices) {
  EXPECT_TRUE(Scatter(Combiner::kAdd, std::vector<float>{0}, true, 1, 0, 3, {0, 1},
                      std::vector<float>{1, 2, 3, 4, 5, 6})
                  .empty());
  EXPECT_EQ(Scatter(Combiner::kSet, std::vector<float>{5, 6}, false, 1, 2, 1, {},
                    std::vector<float>{}),
            (std::vector<float>{5, 6}));
}

}  // namespace
}  // namespace pw
