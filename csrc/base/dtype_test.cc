#include "csrc/base/dtype.h"

#include "absl/strings/match.h"

#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF64, DType::kI32, DType::kBool, DType::kU32}) {
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
  // uint32: numpy's rules, but JAX's (x64 disabled) with int32, where numpy's
  // int64 is not a dtype here.
  EXPECT_EQ(PromoteTypes(DType::kU32, DType::kU32), DType::kU32);
  EXPECT_EQ(PromoteTypes(DType::kU32, DType::kBool), DType::kU32);
  EXPECT_EQ(PromoteTypes(DType::kBool, DType::kU32), DType::kU32);
  EXPECT_EQ(PromoteTypes(DType::kU32, DType::kI32), DType::kI32);
  EXPECT_EQ(PromoteTypes(DType::kI32, DType::kU32), DType::kI32);
  EXPECT_EQ(PromoteTypes(DType::kU32, DType::kF32), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kF32, DType::kU32), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kU32, DType::kF64), DType::kF64);
  EXPECT_EQ(PromoteTypes(DType::kF64, DType::kF32), DType::kF64);
  EXPECT_EQ(DTypeName(DType::kU32), "uint32");
  EXPECT_EQ(DTypeShortName(DType::kU32), "u32");
  EXPECT_EQ(DTypeSize(DType::kU32), 4);
  EXPECT_TRUE(IsInteger(DType::kU32) && IsInteger(DType::kI32));
  EXPECT_FALSE(IsInteger(DType::kBool) || IsInteger(DType::kF32));
  EXPECT_EQ(DTypeOf<uint32_t>(), DType::kU32);
  EXPECT_EQ(DTypeShortName(DType::kBool), "pred");
  EXPECT_EQ(DTypeShortName(DType::kI32), "i32");
  EXPECT_EQ(DTypeSize(DType::kBool), 1);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(DimsToString({2}), "(2,)");
  EXPECT_EQ(DimsToString({2, 3}), "(2, 3)");
  EXPECT_EQ(TypeToString(DType::kF32, {2, 3}), "f32[2,3]");
}

TEST(DTypeTest, CheckedNumBytesRejectsNegativeAndHugeShapesWithoutOverflow) {
  EXPECT_EQ(*CheckedNumBytes("x", DType::kF64, {2, 3}), 48);
  EXPECT_EQ(*CheckedNumBytes("x", DType::kBool, {}), 1);
  EXPECT_EQ(*CheckedNumBytes("x", DType::kF32, {int64_t{1} << 38}), kMaxArrayBytes);
  // Empty arrays have no bytes, but their other dimensions are bounded too
  // (their strides are products of those).
  EXPECT_EQ(*CheckedNumBytes("x", DType::kF32, {1 << 20, 0, 1 << 10}), 0);
  EXPECT_FALSE(CheckedNumBytes("x", DType::kF32, {INT64_MAX, 0, 7}).ok());
  auto negative = CheckedNumBytes("reshape", DType::kF32, {2, -1});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.status().message(), "reshape: negative dimension in f32[2,-1]");
  for (const Dims& dims : {Dims{INT64_MAX, 3}, Dims{int64_t{1} << 32, int64_t{1} << 32}, Dims{(int64_t{1} << 38) + 1}}) {
    auto huge = CheckedNumBytes("broadcast_to", DType::kF32, dims);
    EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument) << TypeToString(DType::kF32, dims);
    EXPECT_TRUE(absl::StrContains(huge.status().message(), "broadcast_to: f32[")) << huge.status();
    EXPECT_TRUE(absl::StrContains(huge.status().message(), "too large")) << huge.status();
  }
}

}  // namespace
}  // namespace pw
