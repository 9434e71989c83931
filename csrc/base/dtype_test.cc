#include "csrc/base/dtype.h"

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF64, DType::kI32, DType::kBool}) {
    auto parsed = DTypeFromName(DTypeName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
}

TEST(DTypeTest, UnsupportedNameIsNamedInError) {
  auto parsed = DTypeFromName("int64");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("int64"), absl::string_view::npos);
}

TEST(DTypeTest, PromotionAndShapes) {
  EXPECT_EQ(PromoteTypes(DType::kF32, DType::kF64), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kF32, DType::kF32), DType::kF32);
  EXPECT_EQ(PromoteTypes(DType::kI32, DType::kF32), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kF32, DType::kI32), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kBool, DType::kF32), DType::kF32);
  EXPECT_EQ(PromoteTypes(DType::kBool, DType::kI32), DType::kI32);
  EXPECT_EQ(PromoteTypes(DType::kI32, DType::kF64), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kBool, DType::kBool), DType::kBool);
  EXPECT_EQ(DTypeShortName(DType::kBool), "pred");
  EXPECT_EQ(DTypeShortName(DType::kI32), "i32");
  EXPECT_EQ(DTypeSize(DType::kBool), 1);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(DimsToString({2}), "(2,)");
  EXPECT_EQ(DimsToString({2, 3}), "(2, 3)");
  EXPECT_EQ(TypeToString(DType::kF32, {2, 3}), "f32[2,3]");
}

}  // namespace
}  // namespace pw
