#include "csrc/function_ir/function_ir.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "csrc/base/error_kind.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

template <typename T>
std::vector<uint8_t> Bytes(std::vector<T> values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

void ExpectInvalid(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(std::string(status.message()), message);
}

TEST(OpRegistryTest, NamesAreUniqueIdentifiersAndFoundByName) {
  std::set<std::string> names;
  for (const OpInfo& info : kOpRegistry) {
    SCOPED_TRACE(std::string(info.name));
    EXPECT_TRUE(names.insert(std::string(info.name)).second);
    ASSERT_FALSE(info.name.empty());
    EXPECT_TRUE(info.name[0] >= 'a' && info.name[0] <= 'z');
    for (char c : info.name) EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
    EXPECT_EQ(OpKindName(info.kind), info.name);
    EXPECT_EQ(OpKindFromName(info.name), info.kind);
  }
  EXPECT_EQ(OpKindFromName("fma"), std::nullopt);
  EXPECT_EQ(OpKindName(static_cast<OpKind>(kNumOpKinds)), "unknown");
  EXPECT_EQ(ReduceKindName(ReduceKind::kArgmax), "argmax");
}

// The builder's Binary and Unary take exactly the registry's binary and
// unary elementwise ops, and type them by the op's rule.
TEST(OpRegistryTest, BinaryAndUnaryFollowTheTypeRules) {
  for (const OpInfo& info : kOpRegistry) {
    SCOPED_TRACE(std::string(info.name));
    FunctionBuilder b("f", "i");
    const int32_t f = b.Parameter(DType::kF32, {2});
    const int32_t i = b.Parameter(DType::kI32, {2});
    const int32_t p = b.Parameter(DType::kBool, {2});
    auto binary = b.Binary(info.kind, f, i);
    auto unary = b.Unary(info.kind, i);
    EXPECT_EQ(!absl::StrContains(binary.status().message(), "is not a binary op"),
              IsBinaryOp(info.kind))
        << binary.status();
    EXPECT_EQ(!absl::StrContains(unary.status().message(), "is not a unary op"),
              IsUnaryOp(info.kind))
        << unary.status();
    auto result_dtype = [&](int32_t v) { return b.type(v).dtype; };
    switch (info.type_rule) {
      case TypeRule::kArithmetic:
        ASSERT_TRUE(binary.ok()) << binary.status();
        EXPECT_EQ(result_dtype(*binary), DType::kF64) << "f32 with i32 promotes to f64";
        break;
      case TypeRule::kComparison:
        ASSERT_TRUE(binary.ok()) << binary.status();
        EXPECT_EQ(result_dtype(*binary), DType::kBool);
        break;
      case TypeRule::kBitwise:
        EXPECT_FALSE(binary.ok());
        ASSERT_TRUE(b.Binary(info.kind, p, p).ok());
        EXPECT_EQ(result_dtype(*b.Binary(info.kind, p, p)), DType::kBool);
        EXPECT_EQ(result_dtype(*b.Binary(info.kind, p, i)), DType::kI32);
        break;
      case TypeRule::kShift:
        EXPECT_FALSE(binary.ok());
        EXPECT_EQ(result_dtype(*b.Binary(info.kind, i, i)), DType::kI32);
        EXPECT_EQ(result_dtype(*b.Binary(info.kind, p, p)), DType::kI32);
        break;
      case TypeRule::kNumeric:
        ASSERT_TRUE(unary.ok()) << unary.status();
        EXPECT_EQ(result_dtype(*unary), DType::kI32);
        break;
      case TypeRule::kFloating:
        ASSERT_TRUE(unary.ok()) << unary.status();
        EXPECT_EQ(result_dtype(*unary), DType::kF64);
        EXPECT_EQ(result_dtype(*b.Unary(info.kind, p)), DType::kF32);
        EXPECT_EQ(result_dtype(*b.Unary(info.kind, f)), DType::kF32);
        break;
      case TypeRule::kInvert:
        ASSERT_TRUE(unary.ok()) << unary.status();
        EXPECT_EQ(result_dtype(*unary), DType::kI32);
        EXPECT_EQ(result_dtype(*b.Unary(info.kind, p)), DType::kBool);
        EXPECT_FALSE(b.Unary(info.kind, f).ok());
        break;
      case TypeRule::kSame:
      case TypeRule::kIndices:  // int32 whatever the operand (TopKTypesAndErrors)
      case TypeRule::kOwn:
        EXPECT_FALSE(IsBinaryOp(info.kind) || IsUnaryOp(info.kind));
        break;
    }
  }
}

TEST(FunctionBuilderTest, SimulatedComputeValidatesDurations) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2});
  const std::string range = "simulated_compute: duration must be a finite number of microseconds from 0 to "
                            "3600000000 (one hour), got ";
  ExpectInvalid(b.SimulatedComputeMicros(x, std::numeric_limits<double>::quiet_NaN()).status(), range + "nan");
  ExpectInvalid(b.SimulatedComputeMicros(x, std::numeric_limits<double>::infinity()).status(), range + "inf");
  ExpectInvalid(b.SimulatedComputeMicros(x, -5).status(), range + "-5");
  ExpectInvalid(b.SimulatedComputeMicros(x, 5e15).status(), range + "5e+15");
  ExpectInvalid(b.SimulatedCompute(x, -1).status(), "simulated_compute: duration must be non-negative, got -1 ns");
  // Two durations that fit alone but not together: the total is checked, never wrapped.
  ASSERT_TRUE(b.SimulatedComputeMicros(x, 3e9).ok());
  ExpectInvalid(b.SimulatedComputeMicros(x, 3e9).status(),
                "simulated_compute: a function's total simulated time must be at most 3600000000 us (one hour); "
                "it has 3000000000 us, plus 3000000000 us");
  ExpectInvalid(b.SimulatedCompute(x, std::numeric_limits<int64_t>::max()).status(),
                "simulated_compute: a function's total simulated time must be at most 3600000000 us (one hour); "
                "it has 3000000000 us, plus 9223372036854775.807 us");
  auto last = b.SimulatedComputeMicros(x, 6e8);  // exactly the limit
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(b.SimulatedCompute(x, 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.SimulatedComputeMicros(x, 0).ok());
  auto ir = b.Build({*last});
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_EQ((*ir)->simulated_ns(), kMaxSimulatedNs);
}

TEST(FunctionBuilderTest, ParametersAreNumberedInOrder) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  ASSERT_TRUE(b.Constant(DType::kF32, {}, Bytes<float>({1})).ok());
  const int32_t y = b.Parameter(DType::kF64, {});
  auto ir = b.Build({y, x});
  ASSERT_TRUE(ir.ok()) << ir.status();
  const FunctionIr& f = **ir;
  EXPECT_EQ(f.num_params(), 2);
  EXPECT_EQ(f.params()[0], x);
  EXPECT_EQ(f.params()[1], y);
  EXPECT_EQ(f.ops()[x].param_index, 0);
  EXPECT_EQ(f.ops()[y].param_index, 1);
  EXPECT_EQ(f.param_type(0).ToString(), "f32[2,3]");
  EXPECT_EQ(f.param_type(1).ToString(), "f64[]");
  EXPECT_EQ(f.num_outputs(), 2);
  EXPECT_EQ(f.output_type(0).ToString(), "f64[]");
  EXPECT_EQ(f.output_type(1).num_bytes(), 24);
  EXPECT_FALSE(f.has_collectives());
  EXPECT_EQ(f.name(), "f");
}

TEST(FunctionBuilderTest, ConstantChecksByteCount) {
  FunctionBuilder b("f", "");
  auto ok = b.Constant(DType::kF64, {3}, Bytes<double>({1, 2, 3}));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(b.type(*ok).ToString(), "f64[3]");
  auto wrong = b.Constant(DType::kF64, {3}, Bytes<float>({1, 2, 3}));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  auto scalar = b.Constant(DType::kF32, {}, Bytes<float>({}));
  EXPECT_EQ(scalar.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.num_values(), 1);
}

TEST(FunctionBuilderTest, ConstantBoolsAreZeroOrOne) {
  FunctionBuilder b("f", "");
  const std::vector<uint8_t> ok = {0, 1, 1};
  EXPECT_TRUE(b.Constant(DType::kBool, {3}, ok).ok());
  const std::vector<uint8_t> two = {0, 1, 2};
  ExpectInvalid(b.Constant(DType::kBool, {3}, two).status(),
                "constant: element 2 of pred[3] is 2; a bool is 0 or 1");
  EXPECT_EQ(b.num_values(), 1);
}

TEST(FunctionBuilderTest, ConvertOnlyWhenDTypeDiffers) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {4});
  auto same = b.Convert(x, DType::kF32);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, x);
  EXPECT_EQ(b.num_values(), 1);
  auto wide = b.Convert(x, DType::kF64);
  ASSERT_TRUE(wide.ok());
  EXPECT_NE(*wide, x);
  EXPECT_EQ(b.type(*wide).ToString(), "f64[4]");
  ExpectInvalid(b.Convert(9, DType::kF64).status(),
                "convert: operand %9 is not a value of this function");
}

TEST(FunctionBuilderTest, BinaryInfersShapeAndPromotes) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  const int32_t s = b.Parameter(DType::kF32, {});
  const int32_t d = b.Parameter(DType::kF64, {});

  auto same = b.Binary(OpKind::kAdd, x, x);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(b.type(*same).ToString(), "f32[2,3]");

  auto scalar_right = b.Binary(OpKind::kSub, x, s);
  ASSERT_TRUE(scalar_right.ok());
  EXPECT_EQ(b.type(*scalar_right).ToString(), "f32[2,3]");

  auto scalar_left = b.Binary(OpKind::kDiv, s, x);
  ASSERT_TRUE(scalar_left.ok());
  EXPECT_EQ(b.type(*scalar_left).ToString(), "f32[2,3]");

  // f64 scalar * f32 matrix: the matrix is converted, the result is f64.
  const int before = b.num_values();
  auto mixed = b.Binary(OpKind::kMul, d, x);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(b.type(*mixed).ToString(), "f64[2,3]");
  EXPECT_EQ(b.num_values(), before + 2);
  auto ir = b.Build({*mixed});
  ASSERT_TRUE(ir.ok());
  const Op& mul = (*ir)->ops()[*mixed];
  EXPECT_EQ(mul.kind, OpKind::kMul);
  ASSERT_EQ(mul.operands.size(), 2u);
  EXPECT_EQ(mul.operands[0], d);
  const Op& convert = (*ir)->ops()[mul.operands[1]];
  EXPECT_EQ(convert.kind, OpKind::kConvert);
  EXPECT_EQ(convert.operands[0], x);
  EXPECT_EQ(convert.type.ToString(), "f64[2,3]");
}

TEST(FunctionBuilderTest, BinaryShapeErrors) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2});
  const int32_t y = b.Parameter(DType::kF32, {3});
  const int32_t m = b.Parameter(DType::kF64, {3, 2});
  const int32_t one = b.Parameter(DType::kF32, {1});
  ExpectInvalid(b.Binary(OpKind::kAdd, x, y).status(),
                "add: incompatible shapes f32[2] and f32[3]");
  ExpectInvalid(b.Binary(OpKind::kMul, m, y).status(),
                "mul: incompatible shapes f64[3,2] and f32[3]");
  ExpectInvalid(b.Binary(OpKind::kLt, y, m).status(),
                "lt: incompatible shapes f32[3] and f64[3,2]");
  // Failed ops add nothing (not even a convert).
  EXPECT_EQ(b.num_values(), 4);
  // numpy broadcasting: a size-1 dimension stretches, shapes align from the right.
  auto stretched = b.Binary(OpKind::kDiv, one, y);
  ASSERT_TRUE(stretched.ok());
  EXPECT_EQ(b.type(*stretched).ToString(), "f32[3]");
  auto rows = b.Binary(OpKind::kMul, m, x);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(b.type(*rows).ToString(), "f64[3,2]");
}

TEST(FunctionBuilderTest, BroadcastDims) {
  Dims out;
  ASSERT_TRUE(BroadcastDims({2, 1, 3}, {4, 1}, &out));
  EXPECT_EQ(out, Dims({2, 4, 3}));
  ASSERT_TRUE(BroadcastDims({}, {5}, &out));
  EXPECT_EQ(out, Dims({5}));
  ASSERT_TRUE(BroadcastDims({1}, {}, &out));
  EXPECT_EQ(out, Dims({1}));
  ASSERT_TRUE(BroadcastDims({0, 1}, {1, 7}, &out));
  EXPECT_EQ(out, Dims({0, 7}));
  EXPECT_FALSE(BroadcastDims({2, 3}, {4}, &out));
  EXPECT_FALSE(BroadcastDims({2, 3}, {3, 3}, &out));
}

TEST(FunctionBuilderTest, PromotionOfIntsAndBools) {
  FunctionBuilder b("f", "");
  const int32_t i = b.Parameter(DType::kI32, {2});
  const int32_t f = b.Parameter(DType::kF32, {2});
  const int32_t p = b.Parameter(DType::kBool, {2});
  const int32_t d = b.Parameter(DType::kF64, {});
  auto type_of = [&](absl::StatusOr<int32_t> v) {
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? b.type(*v).ToString() : std::string("error");
  };
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, i, f)), "f64[2]");  // as numpy
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, i, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kMul, p, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kMul, p, f)), "f32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, p, p)), "pred[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kDiv, i, i)), "f64[2]");  // true division
  EXPECT_EQ(type_of(b.Binary(OpKind::kDiv, p, p)), "f64[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kPow, p, p)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kPow, i, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kMax, i, d)), "f64[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kLt, i, f)), "pred[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kEq, p, p)), "pred[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kXor, p, p)), "pred[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kExp, i)), "f64[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kSqrt, p)), "f32[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kSin, f)), "f32[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kAbs, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kNot, p)), "pred[2]");
  EXPECT_EQ(type_of(b.Convert(f, DType::kI32)), "i32[2]");
  EXPECT_EQ(type_of(b.Convert(i, DType::kBool)), "pred[2]");
}

// A comparison of int32 with uint32 reads both in float64, where every value
// of either is exact: in int32 (their promoted type) uint32's values above
// 2^31 would wrap negative.
TEST(FunctionBuilderTest, ComparisonOfInt32WithUint32IsExact) {
  FunctionBuilder b("f", "");
  const int32_t u = b.Parameter(DType::kU32, {2});
  const int32_t i = b.Parameter(DType::kI32, {2});
  const absl::StatusOr<int32_t> lt = b.Binary(OpKind::kLt, i, u);
  ASSERT_TRUE(lt.ok()) << lt.status();
  const absl::StatusOr<int32_t> eq = b.Binary(OpKind::kEq, u, u);  // same dtype: as it is
  ASSERT_TRUE(eq.ok()) << eq.status();
  auto ir = b.Build({*lt, *eq});
  ASSERT_TRUE(ir.ok()) << ir.status();
  const Op& op = (*ir)->ops()[*lt];
  for (int32_t operand : op.operands) {
    EXPECT_EQ((*ir)->ops()[operand].type.dtype, DType::kF64);
  }
  for (int32_t operand : (*ir)->ops()[*eq].operands) {
    EXPECT_EQ((*ir)->ops()[operand].type.dtype, DType::kU32);
  }
}

// uint32 takes numpy's promotion where numpy's result is a dtype we have,
// and JAX's (x64 disabled) with int32, where numpy's is int64.
TEST(FunctionBuilderTest, PromotionOfUint32) {
  FunctionBuilder b("f", "");
  const int32_t u = b.Parameter(DType::kU32, {2});
  const int32_t i = b.Parameter(DType::kI32, {2});
  const int32_t f = b.Parameter(DType::kF32, {2});
  const int32_t p = b.Parameter(DType::kBool, {2});
  const int32_t d = b.Parameter(DType::kF64, {2});
  auto type_of = [&](absl::StatusOr<int32_t> v) {
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? b.type(*v).ToString() : std::string("error");
  };
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, u, u)), "u32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, u, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kSub, i, u)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kMul, u, p)), "u32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, u, f)), "f64[2]");  // as numpy
  EXPECT_EQ(type_of(b.Binary(OpKind::kAdd, f, u)), "f64[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kMax, d, u)), "f64[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kDiv, u, u)), "f64[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kPow, u, u)), "u32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kLt, u, i)), "pred[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kAnd, u, p)), "u32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kXor, u, u)), "u32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kOr, u, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kShiftLeft, u, p)), "u32[2]");
  EXPECT_EQ(type_of(b.Binary(OpKind::kShiftRightLogical, i, u)), "i32[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kNot, u)), "u32[2]");
  EXPECT_EQ(type_of(b.Unary(OpKind::kNeg, u)), "u32[2]");  // wraps, as numpy
  EXPECT_EQ(type_of(b.Unary(OpKind::kExp, u)), "f64[2]");
  EXPECT_EQ(type_of(b.Select(p, u, i)), "i32[2]");
  EXPECT_EQ(type_of(b.Reduce(ReduceKind::kSum, u, nullptr, false)), "u32[]");
  EXPECT_EQ(type_of(b.Reduce(ReduceKind::kMean, u, nullptr, false)), "f64[]");
  EXPECT_EQ(type_of(b.Reduce(ReduceKind::kArgmax, u, nullptr, false)), "i32[]");
  EXPECT_EQ(type_of(b.TopK(u, 1)), "i32[1]");
}

TEST(FunctionBuilderTest, BitwiseShiftAndBitcastTypeErrors) {
  FunctionBuilder b("f", "");
  const int32_t u = b.Parameter(DType::kU32, {2});
  const int32_t f = b.Parameter(DType::kF32, {2});
  const int32_t p = b.Parameter(DType::kBool, {2});
  const int32_t d = b.Parameter(DType::kF64, {2});
  const int32_t i = b.Parameter(DType::kI32, {2});
  ExpectInvalid(b.Binary(OpKind::kAnd, u, f).status(),
                "and: operands must be bool or integers, got u32[2] and f32[2]");
  ExpectInvalid(b.Binary(OpKind::kShiftLeft, f, u).status(),
                "shift_left: operands must be integers, got f32[2] and u32[2]");
  ExpectInvalid(b.Unary(OpKind::kNot, d).status(),
                "not: operand must be bool or an integer, got f64[2]");
  ExpectInvalid(b.BitcastConvert(d, DType::kU32).status(),
                "bitcast_convert_type: f64[2] to uint32: needs two of float32, int32 and uint32 "
                "(the same width, not bool)");
  ExpectInvalid(b.BitcastConvert(p, DType::kBool).status(),
                "bitcast_convert_type: pred[2] to bool: needs two of float32, int32 and uint32 "
                "(the same width, not bool)");
  EXPECT_EQ(GetErrorKind(b.BitcastConvert(u, DType::kF64).status()), ErrorKind::kUnsupportedType);
  EXPECT_EQ(GetErrorKind(b.Binary(OpKind::kXor, d, p).status()), ErrorKind::kUnsupportedType);
  EXPECT_EQ(b.num_values(), 5);  // no op added by the failures
  EXPECT_EQ(*b.BitcastConvert(u, DType::kU32), u);
  auto bits = b.BitcastConvert(f, DType::kU32);
  ASSERT_TRUE(bits.ok()) << bits.status();
  EXPECT_EQ(b.type(*bits).ToString(), "u32[2]");
  EXPECT_EQ(b.type(*b.BitcastConvert(*bits, DType::kI32)).ToString(), "i32[2]");
  EXPECT_EQ(b.type(*b.BitcastConvert(i, DType::kF32)).ToString(), "f32[2]");
  auto ir = b.Build({*bits});
  ASSERT_TRUE(ir.ok());
  EXPECT_TRUE(absl::StrContains((*ir)->ToText(), "bitcast_convert_type %1 : u32[2]"))
      << (*ir)->ToText();
}

TEST(FunctionBuilderTest, PsumOfBoolCountsInInt32) {
  FunctionBuilder b("f", "i");
  const int32_t p = b.Parameter(DType::kBool, {3});
  auto count = b.Psum(p, "i");
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(b.type(*count).ToString(), "i32[3]");
}

TEST(FunctionBuilderTest, ElementwiseTypeErrors) {
  FunctionBuilder b("f", "");
  const int32_t i = b.Parameter(DType::kI32, {2});
  const int32_t p = b.Parameter(DType::kBool, {2});
  const int32_t f = b.Parameter(DType::kF32, {3});
  ExpectInvalid(b.Binary(OpKind::kAnd, f, f).status(),
                "and: operands must be bool or integers, got f32[3] and f32[3]");
  ExpectInvalid(b.Binary(OpKind::kSub, p, p).status(),
                "sub: boolean subtract is not supported (pred[2] and pred[2]); use logical_xor");
  ExpectInvalid(b.Unary(OpKind::kNot, f).status(), "not: operand must be bool or an integer, got f32[3]");
  ExpectInvalid(b.Unary(OpKind::kNeg, p).status(),
                "neg: negative of a bool is not supported (pred[2]); use logical_not");
  ExpectInvalid(b.Unary(OpKind::kAdd, i).status(), "unary: add is not a unary op");
  ExpectInvalid(b.Binary(OpKind::kExp, i, i).status(), "binary: exp is not a binary op");
  ExpectInvalid(b.Select(i, i, i).status(), "select: condition must be bool, got i32[2]");
  ExpectInvalid(b.Select(p, f, f).status(), "select: incompatible shapes pred[2], f32[3] and f32[3]");
  EXPECT_EQ(b.num_values(), 3);
  // Operand dtypes are unsupported types (Python's TypeError); shapes and op kinds are not.
  for (const absl::Status& st : {b.Binary(OpKind::kAnd, f, f).status(), b.Binary(OpKind::kSub, p, p).status(),
                                 b.Unary(OpKind::kNot, f).status(), b.Unary(OpKind::kNeg, p).status(),
                                 b.Select(i, i, i).status()}) {
    EXPECT_EQ(GetErrorKind(st), ErrorKind::kUnsupportedType) << st;
  }
  EXPECT_EQ(GetErrorKind(b.Select(p, f, f).status()), ErrorKind::kNone);
  EXPECT_EQ(GetErrorKind(b.Unary(OpKind::kAdd, i).status()), ErrorKind::kNone);
}

TEST(FunctionBuilderTest, SelectBroadcastsAndPromotes) {
  FunctionBuilder b("f", "");
  const int32_t c = b.Parameter(DType::kBool, {2, 1});
  const int32_t x = b.Parameter(DType::kI32, {3});
  const int32_t y = b.Parameter(DType::kF32, {});
  auto w = b.Select(c, x, y);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(b.type(*w).ToString(), "f64[2,3]");
  auto ir = b.Build({*w});
  ASSERT_TRUE(ir.ok());
  EXPECT_NE((*ir)->ToText().find("select %0, %"), std::string::npos) << (*ir)->ToText();
}

TEST(FunctionBuilderTest, OperandErrors) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2});
  ExpectInvalid(b.Binary(OpKind::kSub, x, 7).status(),
                "sub: operand %7 is not a value of this function");
  ExpectInvalid(b.Binary(OpKind::kAdd, -1, x).status(),
                "add: operand %-1 is not a value of this function");
  ExpectInvalid(b.Unary(OpKind::kNeg, 1).status(),
                "neg: operand %1 is not a value of this function");
  ExpectInvalid(b.Psum(3, "i").status(), "psum: operand %3 is not a value of this function");
  EXPECT_EQ(b.Binary(OpKind::kNeg, x, x).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Binary(OpKind::kPsum, x, x).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Unary(OpKind::kAdd, x).status().code(), absl::StatusCode::kInvalidArgument);
  auto neg = b.Unary(OpKind::kNeg, x);
  ASSERT_TRUE(neg.ok());
  EXPECT_EQ(b.type(*neg).ToString(), "f32[2]");
}

TEST(FunctionBuilderTest, PsumAxisNames) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF64, {5});
  ExpectInvalid(b.Psum(x, "j").status(), "psum: unbound axis name 'j' (bound: 'i')");
  ExpectInvalid(b.Psum(x, "").status(), "psum: unbound axis name '' (bound: 'i')");
  EXPECT_EQ(GetErrorKind(b.Psum(x, "j").status()), ErrorKind::kUnboundName);
  auto s = b.Psum(x, "i");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(b.type(*s).ToString(), "f64[5]");
  auto ir = b.Build({*s});
  ASSERT_TRUE(ir.ok());
  EXPECT_TRUE((*ir)->has_collectives());
  EXPECT_EQ((*ir)->ops()[*s].axis_name, "i");
  EXPECT_EQ((*ir)->axis_name(), "i");

  FunctionBuilder unbound("g", "");
  const int32_t y = unbound.Parameter(DType::kF32, {});
  ExpectInvalid(unbound.Psum(y, "j").status(),
                "psum: unbound axis name 'j' (this function has no pmap axis name)");
  ExpectInvalid(unbound.Psum(y, "").status(),
                "psum: unbound axis name '' (this function has no pmap axis name)");
  // An unbound axis name is its own kind (Python's NameError).
  EXPECT_EQ(GetErrorKind(unbound.Psum(y, "j").status()), ErrorKind::kUnboundName);
}

TEST(FunctionBuilderTest, BuildChecksOutputs) {
  {
    FunctionBuilder b("f", "");
    b.Parameter(DType::kF32, {});
    EXPECT_EQ(b.Build({}).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    FunctionBuilder b("f", "");
    b.Parameter(DType::kF32, {});
    ExpectInvalid(b.Build({0, 1}).status(),
                  "return: operand %1 is not a value of this function");
  }
  {
    FunctionBuilder b("f", "");
    const int32_t x = b.Parameter(DType::kF32, {});
    auto ir = b.Build({x, x});
    ASSERT_TRUE(ir.ok());
    EXPECT_EQ((*ir)->num_outputs(), 2);
  }
}

TEST(FunctionIrTest, ToTextMatchesHeaderExample) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF32, {});
  b.Parameter(DType::kF32, {3});
  auto two = b.Constant(DType::kF32, {}, Bytes<float>({2}));
  ASSERT_TRUE(two.ok());
  auto mul = b.Binary(OpKind::kMul, x, *two);
  ASSERT_TRUE(mul.ok());
  auto psum = b.Psum(*mul, "i");
  ASSERT_TRUE(psum.ok());
  auto ir = b.Build({*psum});
  ASSERT_TRUE(ir.ok());
  EXPECT_EQ((*ir)->ToText(),
            "func @f(%0: f32[], %1: f32[3]) axis=i {\n"
            "  %2 = const f32[] 2\n"
            "  %3 = mul %0, %2 : f32[]\n"
            "  %4 = psum[i] %3 : f32[]\n"
            "  return %4\n"
            "}\n");
}

TEST(FunctionIrTest, ToTextConstantsConvertsAndNeg) {
  FunctionBuilder b("g", "");
  const int32_t x = b.Parameter(DType::kF64, {3});
  auto small = b.Constant(DType::kF32, {3}, Bytes<float>({1, 2.5f, -3}));
  auto big = b.Constant(DType::kF64, {2, 3}, Bytes<double>({0.1, 2, 3, 4, 5, 6}));
  auto half = b.Constant(DType::kF64, {}, Bytes<double>({0.5}));
  ASSERT_TRUE(small.ok() && big.ok() && half.ok());
  auto sum = b.Binary(OpKind::kAdd, *small, x);  // folds the f32 constant to f64
  ASSERT_TRUE(sum.ok());
  auto neg = b.Unary(OpKind::kNeg, *sum);
  ASSERT_TRUE(neg.ok());
  auto ir = b.Build({*neg, x});
  ASSERT_TRUE(ir.ok());
  const std::string text = (*ir)->ToText();
  EXPECT_NE(text.find("func @g(%0: f64[3]) {\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%1 = const f32[3] [1, 2.5, -3]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%2 = const f64[2,3] [0.1, 2, 3, 4, ...]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%3 = const f64[] 0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%4 = const f64[3] [1, 2.5, -3]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%5 = add %4, %0 : f64[3]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%6 = neg %5 : f64[3]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  return %6, %0\n}\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("axis="), std::string::npos) << text;
}

TEST(FunctionIrTest, ToTextIntAndBoolConstants) {
  FunctionBuilder b("h", "");
  auto ints = b.Constant(DType::kI32, {3}, Bytes<int32_t>({1, -2, 3}));
  auto preds = b.Constant(DType::kBool, {2}, Bytes<uint8_t>({1, 0}));
  ASSERT_TRUE(ints.ok() && preds.ok());
  auto ir = b.Build({*ints, *preds});
  ASSERT_TRUE(ir.ok());
  const std::string text = (*ir)->ToText();
  EXPECT_NE(text.find("%0 = const i32[3] [1, -2, 3]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%1 = const pred[2] [true, false]\n"), std::string::npos) << text;
}


TEST(FunctionBuilderTest, ReduceTypes) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF32, {3, 4});
  const int32_t n = b.Parameter(DType::kI32, {3, 4});
  const int32_t p = b.Parameter(DType::kBool, {3, 4});
  const std::vector<int64_t> last = {-1};
  const std::vector<int64_t> both = {1, 0};
  auto sum = b.Reduce(ReduceKind::kSum, x, &last, false);
  auto keep = b.Reduce(ReduceKind::kMax, x, &both, true);
  auto all = b.Reduce(ReduceKind::kMin, x, nullptr, false);
  auto mean_int = b.Reduce(ReduceKind::kMean, n, &last, false);
  auto sum_bool = b.Reduce(ReduceKind::kSum, p, nullptr, true);
  auto arg = b.Reduce(ReduceKind::kArgmax, x, nullptr, false);
  ASSERT_TRUE(sum.ok() && keep.ok() && all.ok() && mean_int.ok() && sum_bool.ok() && arg.ok());
  EXPECT_EQ(b.type(*sum).ToString(), "f32[3]");
  EXPECT_EQ(b.type(*keep).ToString(), "f32[1,1]");
  EXPECT_EQ(b.type(*all).ToString(), "f32[]");
  EXPECT_EQ(b.type(*mean_int).ToString(), "f64[3]");
  EXPECT_EQ(b.type(*sum_bool).ToString(), "i32[1,1]");
  EXPECT_EQ(b.type(*arg).ToString(), "i32[]");
  const std::vector<int64_t> no_axes;
  auto identity = b.Reduce(ReduceKind::kSum, x, &no_axes, false);
  ASSERT_TRUE(identity.ok());
  EXPECT_EQ(b.type(*identity).ToString(), "f32[3,4]");
  auto ir = b.Build({*sum, *keep});
  ASSERT_TRUE(ir.ok());
  EXPECT_NE((*ir)->ToText().find("sum[axes=(1)]"), std::string::npos) << (*ir)->ToText();
  EXPECT_NE((*ir)->ToText().find("max[axes=(0,1),keepdims]"), std::string::npos);
  EXPECT_FALSE((*ir)->has_collectives());
}

TEST(FunctionBuilderTest, ReduceErrors) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF32, {3, 4});
  const int32_t e = b.Parameter(DType::kF32, {0, 2});
  const std::vector<int64_t> two = {2};
  const std::vector<int64_t> neg = {-3};
  const std::vector<int64_t> rep = {1, -1};
  const std::vector<int64_t> both = {0, 1};
  const std::vector<int64_t> zero = {0};
  ExpectInvalid(b.Reduce(ReduceKind::kSum, x, &two, false).status(),
                "sum: axis 2 is out of range for f32[3,4]");
  ExpectInvalid(b.Reduce(ReduceKind::kMean, x, &neg, false).status(),
                "mean: axis -3 is out of range for f32[3,4]");
  ExpectInvalid(b.Reduce(ReduceKind::kMax, x, &rep, false).status(),
                "max: axis -1 is repeated for f32[3,4]");
  ExpectInvalid(b.Reduce(ReduceKind::kArgmax, x, &both, false).status(),
                "argmax: takes a single axis or none, got 2 axes for f32[3,4]");
  ExpectInvalid(b.Reduce(ReduceKind::kMin, e, &zero, false).status(),
                "min: zero-size reduction of f32[0,2] has no identity");
  EXPECT_TRUE(b.Reduce(ReduceKind::kSum, e, &zero, false).ok());
  ExpectInvalid(b.Reduce(ReduceKind::kSum, 99, nullptr, false).status(),
                "sum: operand %99 is not a value of this function");
}

TEST(FunctionBuilderTest, CollectiveTypesAndErrors) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kI32, {2, 3});
  const int32_t p = b.Parameter(DType::kBool, {2});
  auto mean = b.Pcollective(OpKind::kPmean, x, "i");
  auto mx = b.Pcollective(OpKind::kPmax, p, "i");
  auto idx = b.AxisIndex("i");
  ASSERT_TRUE(mean.ok() && mx.ok() && idx.ok());
  EXPECT_EQ(b.type(*mean).ToString(), "i32[2,3]");
  EXPECT_EQ(b.type(*mx).ToString(), "pred[2]");
  EXPECT_EQ(b.type(*idx).ToString(), "i32[]");
  ExpectInvalid(b.Pcollective(OpKind::kPmin, x, "j").status(),
                "pmin: unbound axis name 'j' (bound: 'i')");
  ExpectInvalid(b.AxisIndex("j").status(), "axis_index: unbound axis name 'j' (bound: 'i')");
  ExpectInvalid(b.Pcollective(OpKind::kPmean, p, "i").status(),
                "pmean: operand must be numeric, got pred[2]");
  EXPECT_EQ(b.Pcollective(OpKind::kAdd, x, "i").status().code(),
            absl::StatusCode::kInvalidArgument);
  // all_gather and ppermute need the axis size.
  EXPECT_EQ(b.AllGather(x, "i", 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.Ppermute(x, "i", {{0, 1}}).status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectInvalid(b.SetAxisSize(0), "set_axis_size: needs 1 <= n <= 65536 (the most devices a gang has), got 0");
  EXPECT_EQ(b.SetAxisSize(int64_t{1} << 30).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.SetAxisSize(4).ok());
  auto g = b.AllGather(x, "i", 1);
  auto g_last = b.AllGather(x, "i", -1);
  ASSERT_TRUE(g.ok() && g_last.ok());
  EXPECT_EQ(b.type(*g).ToString(), "i32[2,4,3]");
  EXPECT_EQ(b.type(*g_last).ToString(), "i32[2,3,4]");
  ExpectInvalid(b.AllGather(x, "i", 3).status(),
                "all_gather: axis 3 is out of range for i32[2,3] (result rank 3)");
  ExpectInvalid(b.AllGather(x, "k", 0).status(),
                "all_gather: unbound axis name 'k' (bound: 'i')");
  auto pp = b.Ppermute(x, "i", {{0, 1}, {1, 0}});
  ASSERT_TRUE(pp.ok());
  EXPECT_EQ(b.type(*pp).ToString(), "i32[2,3]");
  ExpectInvalid(b.Ppermute(x, "i", {{0, 4}}).status(),
                "ppermute: perm pair (0, 4) is out of range for 4 shards");
  ExpectInvalid(b.Ppermute(x, "i", {{0, 1}, {0, 2}}).status(),
                "ppermute: perm pair (0, 2) repeats a source or destination");
  auto ir = b.Build({*mean, *idx, *g, *pp});
  ASSERT_TRUE(ir.ok());
  EXPECT_TRUE((*ir)->has_collectives());
  EXPECT_EQ((*ir)->axis_size(), 4);
  const std::string text = (*ir)->ToText();
  EXPECT_NE(text.find("axis=i axis_size=4"), std::string::npos) << text;
  EXPECT_NE(text.find("pmean[i]"), std::string::npos) << text;
  EXPECT_NE(text.find("all_gather[i][axis=1]"), std::string::npos) << text;
  EXPECT_NE(text.find("ppermute[i][sources=(1,0,-1,-1)]"), std::string::npos) << text;
}

// top_k gives int32 positions for every dtype, k along the last axis; the
// registry says so (kIndices).
TEST(FunctionBuilderTest, TopKTypesAndErrors) {
  EXPECT_EQ(GetTypeRule(OpKind::kTopK), TypeRule::kIndices);
  FunctionBuilder b("f", "");
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kBool}) {
    const int32_t x = b.Parameter(dtype, {2, 3, 5});
    auto t = b.TopK(x, 2);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(b.type(*t).ToString(), "i32[2,3,2]");
  }
  const int32_t v = b.Parameter(DType::kF32, {4});
  const int32_t e = b.Parameter(DType::kF32, {3, 0});
  auto all = b.TopK(v, 4);
  auto none = b.TopK(v, 0);
  auto empty = b.TopK(e, 0);
  ASSERT_TRUE(all.ok() && none.ok() && empty.ok());
  EXPECT_NE(*all, v);  // never elided: positions, not the operand
  EXPECT_EQ(b.type(*none).ToString(), "i32[0]");
  EXPECT_EQ(b.type(*empty).ToString(), "i32[3,0]");
  ExpectInvalid(b.TopK(v, 5).status(), "top_k: k must be in [0, 4] (the last dimension of f32[4]), got 5");
  ExpectInvalid(b.TopK(v, -1).status(), "top_k: k must be in [0, 4] (the last dimension of f32[4]), got -1");
  ExpectInvalid(b.TopK(e, 1).status(), "top_k: k must be in [0, 0] (the last dimension of f32[3,0]), got 1");
  ExpectInvalid(b.TopK(b.Parameter(DType::kF32, {}), 0).status(),
                "top_k: operand must have at least one dimension, got f32[]");
  ExpectInvalid(b.TopK(b.Parameter(DType::kBool, {int64_t{1} << 32}), 1).status(),
                "top_k: the last dimension of pred[4294967296] is beyond int32 positions");
  ExpectInvalid(b.TopK(99, 1).status(), "top_k: operand %99 is not a value of this function");
  auto ir = b.Build({*all});
  ASSERT_TRUE(ir.ok());
  EXPECT_NE((*ir)->ToText().find("top_k[k=4] %"), std::string::npos) << (*ir)->ToText();
}

// erf and erfc are transcendental: floats keep their type, int32 computes in
// f64 and bool in f32.
TEST(FunctionBuilderTest, ErfTypes) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2});
  const int32_t k = b.Parameter(DType::kI32, {2});
  const int32_t p = b.Parameter(DType::kBool, {});
  EXPECT_EQ(b.type(*b.Unary(OpKind::kErf, x)).ToString(), "f32[2]");
  EXPECT_EQ(b.type(*b.Unary(OpKind::kErfc, k)).ToString(), "f64[2]");
  EXPECT_EQ(b.type(*b.Unary(OpKind::kErf, p)).ToString(), "f32[]");
}

// scatter: the operand's dtype and the result's dims, updates converted,
// a scalar operand; scatter_add is a scatter into a zero scalar.
TEST(FunctionBuilderTest, ScatterTypesAndErrors) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {3, 4});
  const int32_t k = b.Parameter(DType::kI32, {3, 4});
  const int32_t p = b.Parameter(DType::kBool, {5});
  const int32_t idx = b.Parameter(DType::kI32, {2});
  const int32_t u = b.Parameter(DType::kF64, {3, 2});
  const int32_t one = b.Parameter(DType::kI32, {});
  auto set = b.Scatter(Combiner::kSet, x, idx, u, 1, 4);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(b.type(*set).ToString(), "f32[3,4]");
  auto mul = b.Scatter(Combiner::kMul, k, idx, u, 1, 4);  // f64 updates into int32
  ASSERT_TRUE(mul.ok()) << mul.status();
  EXPECT_EQ(b.type(*mul).ToString(), "i32[3,4]");
  auto scalar = b.Scatter(Combiner::kMax, one, idx, u, 1, 7);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(b.type(*scalar).ToString(), "i32[3,7]");
  auto bool_max = b.Scatter(Combiner::kMax, p, one, one, 0, 5);
  ASSERT_TRUE(bool_max.ok()) << bool_max.status();
  EXPECT_EQ(b.type(*bool_max).ToString(), "pred[5]");
  auto sa = b.ScatterAdd(u, idx, 1, 4);
  ASSERT_TRUE(sa.ok()) << sa.status();
  EXPECT_EQ(b.type(*sa).ToString(), "f64[3,4]");

  ExpectInvalid(b.Scatter(Combiner::kAdd, x, idx, u, 1, 5).status(),
                "scatter: operand f32[3,4] is neither a scalar nor of the result's shape f32[3,5] "
                "(updates f64[3,2], indices i32[2], axis 1)");
  ExpectInvalid(b.Scatter(Combiner::kAdd, x, idx, u, 0, 4).status(),
                "scatter: updates f64[3,2] do not hold indices i32[2] at axis 0 (size 4)");
  ExpectInvalid(b.Scatter(Combiner::kAdd, x, u, u, 1, 4).status(),
                "scatter: indices must be int32, got f64[3,2]");
  ExpectInvalid(b.Scatter(Combiner::kAdd, p, one, one, 0, 5).status(),
                "scatter: add into a bool operand (pred[5]) is not supported, as in JAX; max "
                "and min are logical or and and");
  ExpectInvalid(b.Scatter(Combiner::kMul, p, one, one, 0, 5).status(),
                "scatter: mul into a bool operand (pred[5]) is not supported, as in JAX; max "
                "and min are logical or and and");
  ExpectInvalid(b.Scatter(static_cast<Combiner>(7), x, idx, u, 1, 4).status(),
                "scatter: unknown combiner 7");
  ExpectInvalid(b.ScatterAdd(p, one, 0, 5).status(), "scatter_add: updates must be numeric, got pred[5]");
  // The dtype errors are of the unsupported-type kind (TypeError in Python).
  EXPECT_EQ(GetErrorKind(b.Scatter(Combiner::kAdd, x, u, u, 1, 4).status()),
            ErrorKind::kUnsupportedType);
  EXPECT_EQ(GetErrorKind(b.Scatter(Combiner::kAdd, p, one, one, 0, 5).status()),
            ErrorKind::kUnsupportedType);
  auto ir = b.Build({*set, *scalar});
  ASSERT_TRUE(ir.ok());
  const Op& set_op = (*ir)->ops()[*set];
  EXPECT_EQ((*ir)->ops()[set_op.operands[2]].type.ToString(), "f32[3,2]");  // updates converted
  EXPECT_EQ(set_op.combiner, Combiner::kSet);
  EXPECT_NE((*ir)->ToText().find("scatter[set,axis=1] %0, %3,"), std::string::npos)
      << (*ir)->ToText();
  EXPECT_NE((*ir)->ToText().find("scatter[max,axis=1] %5,"), std::string::npos) << (*ir)->ToText();
}

// sort gives int32 positions of the operand's dims, for every dtype.
TEST(FunctionBuilderTest, SortTypesAndErrors) {
  EXPECT_EQ(GetTypeRule(OpKind::kSort), TypeRule::kIndices);
  FunctionBuilder b("f", "");
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kBool}) {
    const int32_t x = b.Parameter(dtype, {2, 0, 3});
    auto s = b.Sort(x, dtype == DType::kBool);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(b.type(*s).ToString(), "i32[2,0,3]");
  }
  const int32_t v = b.Parameter(DType::kF32, {4});
  const int32_t scalar = b.Parameter(DType::kF32, {});
  ExpectInvalid(b.Sort(scalar, false).status(),
                "sort: operand must have at least one dimension, got f32[]");
  auto up = b.Sort(v, false);
  auto down = b.Sort(v, true);
  auto ir = b.Build({*up, *down});
  ASSERT_TRUE(ir.ok());
  EXPECT_NE((*ir)->ToText().find("= sort %"), std::string::npos) << (*ir)->ToText();
  EXPECT_NE((*ir)->ToText().find("= sort[descending] %"), std::string::npos) << (*ir)->ToText();
}

// cumulative: numpy's cumsum dtypes (bool sums in int32), axes normalized,
// an axis of size 1 needs no op.
TEST(FunctionBuilderTest, CumulativeTypesAndErrors) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {3, 4});
  const int32_t p = b.Parameter(DType::kBool, {5});
  const int32_t row = b.Parameter(DType::kF64, {1, 4});
  auto sum = b.Cumulative(Combiner::kAdd, x, -1, false);
  auto prod = b.Cumulative(Combiner::kMul, p, 0, true);
  auto max = b.Cumulative(Combiner::kMax, p, 0, false);
  ASSERT_TRUE(sum.ok() && prod.ok() && max.ok());
  EXPECT_EQ(b.type(*sum).ToString(), "f32[3,4]");
  EXPECT_EQ(b.type(*prod).ToString(), "i32[5]");
  EXPECT_EQ(b.type(*max).ToString(), "pred[5]");
  EXPECT_EQ(*b.Cumulative(Combiner::kMin, row, 0, false), row);
  const int32_t scalar = b.Parameter(DType::kF32, {});
  ExpectInvalid(b.Cumulative(Combiner::kAdd, scalar, 0, false).status(),
                "cumulative: operand must have at least one dimension, got f32[]");
  ExpectInvalid(b.Cumulative(Combiner::kAdd, x, 2, false).status(),
                "cumulative: axis 2 is out of range for f32[3,4]");
  ExpectInvalid(b.Cumulative(Combiner::kSet, x, 0, false).status(),
                "cumulative: combiner must be add, mul, max or min, got set");
  auto ir = b.Build({*sum, *prod});
  ASSERT_TRUE(ir.ok());
  EXPECT_NE((*ir)->ToText().find("cumulative[add,axis=1] %0"), std::string::npos)
      << (*ir)->ToText();
  EXPECT_NE((*ir)->ToText().find("cumulative[mul,axis=0,reverse] %"), std::string::npos)
      << (*ir)->ToText();
}

TEST(FunctionBuilderTest, CollectivesNeedAnAxisName) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2});
  ExpectInvalid(b.Pcollective(OpKind::kPmax, x, "i").status(),
                "pmax: unbound axis name 'i' (this function has no pmap axis name)");
}

// Casting a constant folds into a new constant, with the kernels' rules.
// Sizes given by the caller never overflow: every op's result is checked.
TEST(FunctionBuilderTest, HugeOrOverflowingShapesAreErrors) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF32, {});
  const int32_t v = b.Parameter(DType::kF32, {4});
  auto expect_error = [](const absl::StatusOr<int32_t>& r, absl::string_view what) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_TRUE(absl::StrContains(r.status().message(), what)) << r.status();
  };
  expect_error(b.BroadcastTo(x, {INT64_MAX, 3}), "broadcast_to: f32[9223372036854775807,3] is too large");
  expect_error(b.BroadcastTo(x, {int64_t{1} << 32, int64_t{1} << 32}), "too large");
  expect_error(b.Reshape(v, {INT64_MAX, INT64_MAX, 0, 4}), "reshape: cannot reshape");
  expect_error(b.Pad(v, {INT64_MAX}, {1}, {0}), "pad: padding");
  expect_error(b.Pad(v, {0}, {0}, {INT64_MAX}), "is too large");
  // A huge step is a valid slice (of one element); its size must not overflow.
  EXPECT_EQ(b.type(*b.Slice(v, {1}, {4}, {INT64_MAX})).dims, Dims{1});
  expect_error(b.ScatterAdd(v, *b.Constant(DType::kI32, {4}, std::vector<uint8_t>(16)), 0, int64_t{1} << 40),
               "scatter: f32[1099511627776] is too large");
  std::vector<uint8_t> none;
  expect_error(b.Constant(DType::kF64, {int64_t{1} << 62, 4}, none), "constant: f64[");
}

TEST(FunctionIrTest, ConvertOfAConstantFolds) {
  FunctionBuilder b("c", "");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto c = b.Constant(DType::kF64, {4}, Bytes<double>({nan, 3.7, -0.0, 1e10}));
  ASSERT_TRUE(c.ok());
  auto i = b.Convert(*c, DType::kI32);
  auto p = b.Convert(*c, DType::kBool);
  auto f = b.Convert(*i, DType::kF32);
  ASSERT_TRUE(i.ok() && p.ok() && f.ok());
  auto ir = b.Build({*i, *p, *f});
  ASSERT_TRUE(ir.ok());
  for (int32_t v : {*i, *p, *f}) EXPECT_EQ((*ir)->ops()[v].kind, OpKind::kConstant);
  const auto& li = (*ir)->ops()[*i].literal;
  std::vector<int32_t> ints(4);
  std::memcpy(ints.data(), li.data(), 16);
  EXPECT_EQ(ints, (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 3, 0,
                                        std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ((*ir)->ops()[*p].literal, (std::vector<uint8_t>{1, 1, 0, 1}));
  float floats[4];
  std::memcpy(floats, (*ir)->ops()[*f].literal.data(), 16);
  EXPECT_EQ(floats[1], 3.0f);
  EXPECT_EQ(floats[0], -2147483648.0f);
}


// --- Loops -------------------------------------------------------------------

// body(c: f32[], x: f32[3], w: f32[3]) -> (c + sum(x * w), x * c): a carry,
// an xs of rows of 3, a const.
std::shared_ptr<const FunctionIr> DotBody(absl::string_view axis_name = "") {
  FunctionBuilder b("body", std::string(axis_name));
  const int32_t c = b.Parameter(DType::kF32, {});
  const int32_t x = b.Parameter(DType::kF32, {3});
  const int32_t w = b.Parameter(DType::kF32, {3});
  const int32_t xw = *b.Binary(OpKind::kMul, x, w);
  const int32_t s = *b.Reduce(ReduceKind::kSum, xw, nullptr, false);
  const int32_t next = *b.Binary(OpKind::kAdd, c, s);
  const int32_t y = *b.Binary(OpKind::kMul, x, c);
  return *b.Build({next, y});
}

TEST(FunctionBuilderScanTest, TypesResultsAndText) {
  for (int64_t length : {0, 1, 2, 200}) {
    SCOPED_TRACE(length);
    FunctionBuilder b("f", "");
    const int32_t c = b.Parameter(DType::kF32, {});
    const int32_t xs = b.Parameter(DType::kF32, {length, 3});
    const int32_t w = b.Parameter(DType::kF32, {3});
    auto results = b.ScanResults(DotBody(), {c, xs, w}, 1, 1, length, false);
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->size(), 2u);
    const int32_t tuple = (*results)[0] - 1;  // the get_elements follow the scan
    ASSERT_EQ(tuple, 3);
    EXPECT_EQ(b.type(tuple).ToString(), absl::StrCat("(f32[], f32[", length, ",3])"));
    EXPECT_EQ(b.type((*results)[0]).ToString(), "f32[]");
    EXPECT_EQ(b.type((*results)[1]).ToString(), absl::StrCat("f32[", length, ",3]"));
    auto ir = b.Build(*results);
    ASSERT_TRUE(ir.ok()) << ir.status();
    EXPECT_EQ((*ir)->nesting_depth(), 1);
    EXPECT_EQ((*ir)->ToText(),
              absl::StrCat(
                  "func @f(%0: f32[], %1: f32[", length, ",3], %2: f32[3]) {\n",
                  "  %3 = scan[length=", length, ",carries=1,xs=1] %0, %1, %2 : (f32[], f32[",
                  length, ",3]) {\n",
                  "    func @body(%0: f32[], %1: f32[3], %2: f32[3]) {\n"
                  "      %3 = mul %1, %2 : f32[3]\n"
                  "      %4 = sum[axes=(0)] %3 : f32[]\n"
                  "      %5 = add %0, %4 : f32[]\n"
                  "      %6 = mul %1, %0 : f32[3]\n"
                  "      return %5, %6\n"
                  "    }\n"
                  "  }\n"
                  "  %4 = get_element[0] %3 : f32[]\n"
                  "  %5 = get_element[1] %3 : f32[", length, ",3]\n"
                  "  return %4, %5\n"
                  "}\n"));
  }
}

TEST(FunctionBuilderScanTest, ReverseAndNoOperandsInText) {
  // A body of no parameters: a length-only scan that stacks a constant.
  FunctionBuilder body("k", "");
  auto one = body.Constant(DType::kI32, {}, Bytes<int32_t>({1}));
  ASSERT_TRUE(one.ok());
  auto k = body.Build({*one});
  ASSERT_TRUE(k.ok());
  FunctionBuilder b("f", "");
  b.Parameter(DType::kF32, {});
  auto results = b.ScanResults(*k, {}, 0, 0, 4, true);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(b.type((*results)[0]).ToString(), "i32[4]");
  auto ir = b.Build(*results);
  ASSERT_TRUE(ir.ok());
  EXPECT_TRUE(absl::StrContains((*ir)->ToText(),
                                "  %1 = scan[length=4,carries=0,xs=0,reverse]  : (i32[4]) {\n"))
      << (*ir)->ToText();
}

TEST(FunctionBuilderScanTest, Errors) {
  auto scan = [](auto&& edit) {
    FunctionBuilder b("f", "i");
    EXPECT_TRUE(b.SetAxisSize(2).ok());
    const int32_t c = b.Parameter(DType::kF32, {});
    const int32_t xs = b.Parameter(DType::kF32, {5, 3});
    const int32_t w = b.Parameter(DType::kF32, {3});
    return edit(b, c, xs, w);
  };
  ExpectInvalid(scan([](FunctionBuilder& b, int32_t c, int32_t xs, int32_t w) {
                  return b.Scan(DotBody(), {c, xs, w}, 1, 1, 4, false).status();
                }),
                "scan of @body: xs 0 is f32[5,3], which needs a leading dimension of the length, 4");
  ExpectInvalid(scan([](FunctionBuilder& b, int32_t c, int32_t xs, int32_t w) {
                  return b.Scan(DotBody(), {c, xs}, 1, 1, 5, false).status();
                }),
                "scan of @body: the body takes 3 parameters, the scan has 2 operands (1 carries, "
                "1 xs, 0 consts)");
  ExpectInvalid(scan([](FunctionBuilder& b, int32_t c, int32_t xs, int32_t w) {
                  return b.Scan(DotBody(), {w, xs, c}, 1, 1, 5, false).status();
                }),
                "scan of @body: body parameter 0 is f32[], but carry 0 gives f32[3]");
  ExpectInvalid(scan([](FunctionBuilder& b, int32_t c, int32_t xs, int32_t w) {
                  return b.Scan(DotBody(), {c, xs, w}, 2, 2, 5, false).status();
                }),
                "scan: 2 carries and 2 xs do not fit in 3 operands");
  ExpectInvalid(scan([](FunctionBuilder& b, int32_t c, int32_t xs, int32_t w) {
                  return b.Scan(DotBody(), {c, xs, w}, 1, 1, -1, false).status();
                }),
                "scan: negative length -1");
  ExpectInvalid(scan([](FunctionBuilder& b, int32_t c, int32_t xs, int32_t w) {
                  return b.Scan(nullptr, {c, xs, w}, 1, 1, 5, false).status();
                }),
                "scan: no body function");
  // A carry that changes type.
  {
    FunctionBuilder body("widen", "");
    const int32_t c = body.Parameter(DType::kF32, {});
    auto next = body.Convert(c, DType::kF64);
    auto fn = body.Build({*next});
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(scan([&](FunctionBuilder& b, int32_t c, int32_t, int32_t) {
                    return b.Scan(*fn, {c}, 1, 0, 3, false).status();
                  }),
                  "scan of @widen: the body returns f64[] for carry 0, which is f32[]; a carry "
                  "keeps its type");
    ExpectInvalid(scan([&](FunctionBuilder& b, int32_t c, int32_t, int32_t) {
                    FunctionBuilder none("none", "");
                    const int32_t p = none.Parameter(DType::kF32, {});
                    return b.Scan(*none.Build({p}), {c, c}, 2, 0, 3, false).status();
                  }),
                  "scan of @none: the body takes 1 parameters, the scan has 2 operands (2 carries, "
                  "0 xs, 0 consts)");
  }
  // Collectives over another axis, and another axis size.
  {
    FunctionBuilder body("sum", "j");
    const int32_t c = body.Parameter(DType::kF32, {});
    auto p = body.Psum(c, "j");
    auto fn = body.Build({*p});
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(scan([&](FunctionBuilder& b, int32_t c, int32_t, int32_t) {
                    return b.Scan(*fn, {c}, 1, 0, 3, false).status();
                  }),
                  "scan of @sum: the body has collectives over axis 'j', the function's axis is 'i'");
    FunctionBuilder sized("sized", "i");
    ASSERT_TRUE(sized.SetAxisSize(3).ok());
    const int32_t d = sized.Parameter(DType::kF32, {});
    auto fs = sized.Build({d});
    ExpectInvalid(scan([&](FunctionBuilder& b, int32_t c, int32_t, int32_t) {
                    return b.Scan(*fs, {c}, 1, 0, 3, false).status();
                  }),
                  "scan of @sized: the body was traced for 3 shards, the function for 2");
  }
  // Simulated time: length times the body's.
  {
    FunctionBuilder body("slow", "");
    const int32_t c = body.Parameter(DType::kF32, {});
    auto s = body.SimulatedCompute(c, kMaxSimulatedNs / 10);
    auto fn = body.Build({*s});
    ASSERT_TRUE(fn.ok());
    FunctionBuilder b("f", "");
    const int32_t x = b.Parameter(DType::kF32, {});
    ASSERT_TRUE(b.Scan(*fn, {x}, 1, 0, 10, false).ok());
    auto again = b.Scan(*fn, {x}, 1, 0, 1, false);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(again.status().message(), "scan of @slow: 1 iterations of"))
        << again.status();
    auto ir = b.Build({x});
    ASSERT_TRUE(ir.ok());
    EXPECT_EQ((*ir)->simulated_ns(), kMaxSimulatedNs);
  }
}

TEST(FunctionBuilderSvdTest, TypesTheTupleAndRefusesWhatLapackCannotTake) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {2, 5, 3});
  const int32_t y = b.Parameter(DType::kF64, {3, 4});
  const int32_t k = b.Parameter(DType::kI32, {3, 3});
  const int32_t h = b.Parameter(DType::kBF16, {3, 3});
  const int32_t v = b.Parameter(DType::kF32, {3});
  const int32_t e = b.Parameter(DType::kF64, {0, 4});
  auto thin = b.Svd(x, false);
  ASSERT_TRUE(thin.ok()) << thin.status();
  EXPECT_EQ(b.type(*thin).ToString(), "(f32[2,5,3], f32[2,3], f32[2,3,3])");
  auto full = b.Svd(y, true);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(b.type(*full).ToString(), "(f64[3,3], f64[3], f64[4,4])");
  auto empty = b.SvdResults(e, true);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(b.type((*empty)[0]).ToString(), "f64[0,0]");
  EXPECT_EQ(b.type((*empty)[1]).ToString(), "f64[0]");
  EXPECT_EQ(b.type((*empty)[2]).ToString(), "f64[4,4]");
  ExpectInvalid(b.Binary(OpKind::kAdd, *thin, *thin).status(),
                "add: operand %6 is the svd tuple (f32[2,5,3], f32[2,3], f32[2,3,3]); take its "
                "elements with get_element");
  ExpectInvalid(b.Svd(k, false).status(), "svd: operand must be float32 or float64, got i32[3,3]");
  ExpectInvalid(b.Svd(h, false).status(), "svd: operand must be float32 or float64, got bf16[3,3]");
  ExpectInvalid(b.Svd(v, false).status(),
                "svd: operand must have at least two dimensions (a matrix), got f32[3]");
  const int32_t big = b.Parameter(DType::kF32, {20000, 20000});
  ExpectInvalid(b.Svd(big, false).status(),
                "svd: the matrices of f32[20000,20000] are too large for LAPACK's workspace "
                "(min(m, n) beyond about 17500)");
  auto ir = b.Build({(*empty)[2]});
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_TRUE(absl::StrContains((*ir)->ToText(), "svd[full_matrices] %1 : (f64[3,3], f64[3], f64[4,4])"))
      << (*ir)->ToText();
}

TEST(FunctionBuilderLuTest, TypesItsTupleAndTheSolvesTheirResult) {
  FunctionBuilder b("f", "");
  const int32_t a = b.Parameter(DType::kF64, {2, 3, 3});
  const int32_t r = b.Parameter(DType::kF64, {2, 3, 4});
  const int32_t f = b.Parameter(DType::kF32, {2, 3, 4});
  const int32_t v = b.Parameter(DType::kF64, {3});
  auto lu = b.Lu(a);
  ASSERT_TRUE(lu.ok()) << lu.status();
  EXPECT_EQ(b.type(*lu).ToString(), "(f64[2,3,3], i32[2,3], i32[2,3])");
  auto x = b.TriangularSolve(a, r, true, false, true);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(b.type(*x).ToString(), "f64[2,3,4]");
  ExpectInvalid(b.Lu(r).status(), "lu: operand must be square matrices [..., n, n], got f64[2,3,4]");
  ExpectInvalid(b.Lu(v).status(), "lu: operand must be square matrices [..., n, n], got f64[3]");
  ExpectInvalid(b.Lu(b.Parameter(DType::kI32, {2, 2})).status(),
                "lu: operand must be float32 or float64, got i32[2,2]");
  ExpectInvalid(b.TriangularSolve(a, f, true, false, false).status(),
                "triangular_solve: a and b must both be float32 or both float64, got f64[2,3,3] "
                "and f32[2,3,4]");
  ExpectInvalid(b.TriangularSolve(r, r, true, false, false).status(),
                "triangular_solve: a must be square matrices [..., n, n] and b [..., n, k] with "
                "the same batch dims, got f64[2,3,4] and f64[2,3,4]");
  ExpectInvalid(b.TriangularSolve(a, b.Parameter(DType::kF64, {3, 3, 4}), true, false, false)
                    .status(),
                "triangular_solve: a must be square matrices [..., n, n] and b [..., n, k] with "
                "the same batch dims, got f64[2,3,3] and f64[3,3,4]");
  auto eigh = b.Eigh(a);
  ASSERT_TRUE(eigh.ok()) << eigh.status();
  EXPECT_EQ(b.type(*eigh).ToString(), "(f64[2,3], f64[2,3,3])");
  auto qr = b.Qr(r, false);
  ASSERT_TRUE(qr.ok()) << qr.status();
  EXPECT_EQ(b.type(*qr).ToString(), "(f64[2,3,3], f64[2,3,4])");
  auto qr_full = b.Qr(b.Parameter(DType::kF32, {5, 2}), true);
  ASSERT_TRUE(qr_full.ok()) << qr_full.status();
  EXPECT_EQ(b.type(*qr_full).ToString(), "(f32[5,5], f32[5,2])");
  ExpectInvalid(b.Qr(v, false).status(),
                "qr: operand must have at least two dimensions (a matrix), got f64[3]");
  auto chol = b.Cholesky(a);
  ASSERT_TRUE(chol.ok()) << chol.status();
  EXPECT_EQ(b.type(*chol).ToString(), "f64[2,3,3]");
  ExpectInvalid(b.Eigh(r).status(), "eigh: operand must be square matrices [..., n, n], got f64[2,3,4]");
  ExpectInvalid(b.Cholesky(f).status(),
                "cholesky: operand must be square matrices [..., n, n], got f32[2,3,4]");
  auto ir = b.Build({*x});
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_TRUE(absl::StrContains((*ir)->ToText(), "triangular_solve[lower,transpose_a] %0, %1"))
      << (*ir)->ToText();
}

TEST(FunctionBuilderScanTest, TuplesAreReadOnlyByGetElement) {
  FunctionBuilder b("f", "");
  const int32_t c = b.Parameter(DType::kF32, {});
  const int32_t xs = b.Parameter(DType::kF32, {2, 3});
  const int32_t w = b.Parameter(DType::kF32, {3});
  auto t = b.Scan(DotBody(), {c, xs, w}, 1, 1, 2, false);
  ASSERT_TRUE(t.ok());
  ExpectInvalid(b.Binary(OpKind::kAdd, *t, c).status(),
                "add: operand %3 is the scan tuple (f32[], f32[2,3]); take its elements "
                "with get_element");
  ExpectInvalid(b.Build({*t}).status(),
                "return: operand %3 is the scan tuple (f32[], f32[2,3]); take its elements "
                "with get_element");
  ExpectInvalid(b.GetElement(c, 0).status(), "get_element: operand %0 is f32[], not a tuple (as scan, while, svd, lu and eigh give)");
  ExpectInvalid(b.GetElement(*t, 2).status(),
                "get_element: index 2 is out of range for (f32[], f32[2,3])");
  ExpectInvalid(b.GetElement(*t, -1).status(),
                "get_element: index -1 is out of range for (f32[], f32[2,3])");
  EXPECT_TRUE(b.GetElement(*t, 1).ok());
}

TEST(FunctionBuilderScanTest, NestingIsBounded) {
  // body_0(c) = c + 1; body_{d+1}(c) = scan(body_d, c) over 2 steps.
  FunctionBuilder b0("body", "");
  const int32_t c0 = b0.Parameter(DType::kF32, {});
  auto one = b0.Constant(DType::kF32, {}, Bytes<float>({1}));
  std::shared_ptr<const FunctionIr> body = *b0.Build({*b0.Binary(OpKind::kAdd, c0, *one)});
  for (int depth = 1; depth <= kMaxNestingDepth; ++depth) {
    FunctionBuilder b("body", "");
    const int32_t c = b.Parameter(DType::kF32, {});
    auto r = b.ScanResults(body, {c}, 1, 0, 2, false);
    ASSERT_TRUE(r.ok()) << depth << r.status();
    body = *b.Build(*r);
    EXPECT_EQ(body->nesting_depth(), depth);
  }
  FunctionBuilder b("f", "");
  const int32_t c = b.Parameter(DType::kF32, {});
  ExpectInvalid(b.Scan(body, {c}, 1, 0, 2, false).status(),
                absl::StrCat("scan of @body: loops nest ", kMaxNestingDepth + 1,
                             " deep, more than the ", kMaxNestingDepth, " allowed"));
}

TEST(FunctionBuilderScanTest, CollectivesOfBodiesCount) {
  FunctionBuilder body("body", "i");
  const int32_t c = body.Parameter(DType::kF32, {});
  auto p = body.Psum(c, "i");
  auto fn = body.Build({*p});
  ASSERT_TRUE(fn.ok());
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF32, {});
  auto r = b.ScanResults(*fn, {x}, 1, 0, 3, false);
  ASSERT_TRUE(r.ok()) << r.status();
  auto ir = b.Build(*r);
  ASSERT_TRUE(ir.ok());
  EXPECT_TRUE((*ir)->has_collectives());
}

// --- While loops ---------------------------------------------------------------

// cond(c: f32[], k: i32[], limit: f32[]) -> c < limit
std::shared_ptr<const FunctionIr> LessCond(absl::string_view axis_name = "") {
  FunctionBuilder b("less", std::string(axis_name));
  const int32_t c = b.Parameter(DType::kF32, {});
  b.Parameter(DType::kI32, {});
  const int32_t limit = b.Parameter(DType::kF32, {});
  return *b.Build({*b.Binary(OpKind::kLt, c, limit)});
}

// body(c: f32[], k: i32[], limit: f32[]) -> (c * 2, k + 1)
std::shared_ptr<const FunctionIr> DoubleBody() {
  FunctionBuilder b("double", "");
  const int32_t c = b.Parameter(DType::kF32, {});
  const int32_t k = b.Parameter(DType::kI32, {});
  b.Parameter(DType::kF32, {});
  auto two = b.Constant(DType::kF32, {}, Bytes<float>({2}));
  auto one = b.Constant(DType::kI32, {}, Bytes<int32_t>({1}));
  return *b.Build({*b.Binary(OpKind::kMul, c, *two), *b.Binary(OpKind::kAdd, k, *one)});
}

TEST(FunctionBuilderWhileTest, TypesResultsAndText) {
  FunctionBuilder b("f", "");
  const int32_t c = b.Parameter(DType::kF32, {});
  const int32_t k = b.Parameter(DType::kI32, {});
  const int32_t limit = b.Parameter(DType::kF32, {});
  auto results = b.WhileResults(LessCond(), DoubleBody(), {c, k, limit}, 2);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  const int32_t tuple = (*results)[0] - 1;
  EXPECT_EQ(b.type(tuple).ToString(), "(f32[], i32[])");
  EXPECT_EQ(b.type((*results)[1]).ToString(), "i32[]");
  auto ir = b.Build(*results);
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_EQ((*ir)->nesting_depth(), 1);
  EXPECT_EQ((*ir)->simulated_ns(), 0);
  EXPECT_EQ((*ir)->ToText(),
            "func @f(%0: f32[], %1: i32[], %2: f32[]) {\n"
            "  %3 = while[carries=2] %0, %1, %2 : (f32[], i32[]) {\n"
            "    func @less(%0: f32[], %1: i32[], %2: f32[]) {\n"
            "      %3 = lt %0, %2 : pred[]\n"
            "      return %3\n"
            "    }\n"
            "    func @double(%0: f32[], %1: i32[], %2: f32[]) {\n"
            "      %3 = const f32[] 2\n"
            "      %4 = const i32[] 1\n"
            "      %5 = mul %0, %3 : f32[]\n"
            "      %6 = add %1, %4 : i32[]\n"
            "      return %5, %6\n"
            "    }\n"
            "  }\n"
            "  %4 = get_element[0] %3 : f32[]\n"
            "  %5 = get_element[1] %3 : i32[]\n"
            "  return %4, %5\n"
            "}\n");
}

TEST(FunctionBuilderWhileTest, Errors) {
  auto loop = [](auto&& edit) {
    FunctionBuilder b("f", "i");
    EXPECT_TRUE(b.SetAxisSize(2).ok());
    const int32_t c = b.Parameter(DType::kF32, {});
    const int32_t k = b.Parameter(DType::kI32, {});
    const int32_t limit = b.Parameter(DType::kF32, {});
    return edit(b, c, k, limit);
  };
  const std::string label = "while of @less and @double";
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(LessCond(), DoubleBody(), {c, k, limit}, 0).status();
                }),
                "while: 0 carries do not fit in 3 operands (a while carries at least one value)");
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(LessCond(), DoubleBody(), {c, k, limit}, 4).status();
                }),
                "while: 4 carries do not fit in 3 operands (a while carries at least one value)");
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(nullptr, DoubleBody(), {c, k, limit}, 2).status();
                }),
                "while: no cond function");
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(LessCond(), nullptr, {c, k, limit}, 2).status();
                }),
                "while: no body function");
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(LessCond(), DoubleBody(), {c, k}, 2).status();
                }),
                label + ": the cond takes 3 parameters, the loop has 2 operands (2 carries, 0 "
                        "consts)");
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(LessCond(), DoubleBody(), {k, c, limit}, 2).status();
                }),
                label + ": cond parameter 0 is f32[], but carry 0 gives i32[]");
  ExpectInvalid(loop([](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(LessCond(), DoubleBody(), {c, k, k}, 2).status();
                }),
                label + ": cond parameter 2 is f32[], but const 0 gives i32[]");
  // The body's parameters are checked as the cond's.
  {
    FunctionBuilder body("double", "");
    const int32_t c = body.Parameter(DType::kF32, {});
    const int32_t k = body.Parameter(DType::kI32, {});
    body.Parameter(DType::kI32, {});
    auto fn = body.Build({c, k});
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                    return b.While(LessCond(), *fn, {c, k, limit}, 2).status();
                  }),
                  label + ": body parameter 2 is i32[], but const 0 gives f32[]");
  }
  // A cond that is not one bool scalar.
  for (int variant = 0; variant < 3; ++variant) {
    FunctionBuilder cond("less", "");
    const int32_t c = cond.Parameter(DType::kF32, {});
    const int32_t k = cond.Parameter(DType::kI32, {});
    cond.Parameter(DType::kF32, {});
    std::vector<int32_t> outs;
    std::string want;
    if (variant == 0) {
      outs = {k};
      want = "(i32[])";
    } else if (variant == 1) {
      const int32_t lt = *cond.Binary(OpKind::kLt, c, c);
      outs = {lt, lt};
      want = "(pred[], pred[])";
    } else {
      outs = {*cond.BroadcastTo(*cond.Binary(OpKind::kLt, c, c), {2})};
      want = "(pred[2])";
    }
    auto fn = cond.Build(outs);
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                    return b.While(*fn, DoubleBody(), {c, k, limit}, 2).status();
                  }),
                  label + ": the cond must return one bool scalar (pred[]), it returns " + want);
  }
  // A body that returns too few values, or a carry of another type.
  {
    FunctionBuilder body("double", "");
    const int32_t c = body.Parameter(DType::kF32, {});
    body.Parameter(DType::kI32, {});
    body.Parameter(DType::kF32, {});
    auto fn = body.Build({c});
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                    return b.While(LessCond(), *fn, {c, k, limit}, 2).status();
                  }),
                  label + ": the body returns 1 values for 2 carries");
  }
  {
    FunctionBuilder body("double", "");
    const int32_t c = body.Parameter(DType::kF32, {});
    const int32_t k = body.Parameter(DType::kI32, {});
    body.Parameter(DType::kF32, {});
    auto fn = body.Build({c, *body.Convert(k, DType::kF32)});
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                    return b.While(LessCond(), *fn, {c, k, limit}, 2).status();
                  }),
                  label + ": the body returns f32[] for carry 1, which is i32[]; a carry keeps "
                          "its type");
  }
  // Collectives over another axis, or traced for another size: a cond
  // psum(c) < limit over `axis` of `size` shards (0: not given).
  auto psum_cond = [](const std::string& axis, int64_t size) {
    FunctionBuilder cond("less", axis);
    if (size > 0) EXPECT_TRUE(cond.SetAxisSize(size).ok());
    const int32_t x = cond.Parameter(DType::kF32, {});
    cond.Parameter(DType::kI32, {});
    const int32_t l = cond.Parameter(DType::kF32, {});
    return *cond.Build({*cond.Binary(OpKind::kLt, *cond.Psum(x, axis), l)});
  };
  ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(psum_cond("j", 0), DoubleBody(), {c, k, limit}, 2).status();
                }),
                label + ": the cond has collectives over axis 'j', the function's axis is 'i'");
  ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                  return b.While(psum_cond("i", 3), DoubleBody(), {c, k, limit}, 2).status();
                }),
                label + ": the cond was traced for 3 shards, the function for 2");
  EXPECT_TRUE(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                return b.While(psum_cond("i", 2), DoubleBody(), {c, k, limit}, 2).status();
              }).ok());
  // Simulated compute: a while's trip count is unknown.
  {
    FunctionBuilder body("double", "");
    const int32_t c = body.Parameter(DType::kF32, {});
    const int32_t k = body.Parameter(DType::kI32, {});
    body.Parameter(DType::kF32, {});
    auto fn = body.Build({*body.SimulatedCompute(c, 1000), k});
    ASSERT_TRUE(fn.ok());
    ExpectInvalid(loop([&](FunctionBuilder& b, int32_t c, int32_t k, int32_t limit) {
                    return b.While(LessCond(), *fn, {c, k, limit}, 2).status();
                  }),
                  label + ": the body has simulated compute, which a loop whose trip count is "
                          "known only on the device cannot count (a scan's body may have it)");
  }
}

TEST(FunctionBuilderWhileTest, NestingAndCollectivesOfConds) {
  // A while whose cond has a scan inside nests as deep as the scan's body + 2.
  FunctionBuilder inc("inc", "");
  const int32_t x = inc.Parameter(DType::kF32, {});
  auto one = inc.Constant(DType::kF32, {}, Bytes<float>({1}));
  auto inc_fn = inc.Build({*inc.Binary(OpKind::kAdd, x, *one)});
  ASSERT_TRUE(inc_fn.ok());
  FunctionBuilder cond("less", "i");
  const int32_t c = cond.Parameter(DType::kF32, {});
  cond.Parameter(DType::kI32, {});
  const int32_t limit = cond.Parameter(DType::kF32, {});
  auto scanned = cond.ScanResults(*inc_fn, {c}, 1, 0, 2, false);
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  auto total = cond.Psum((*scanned)[0], "i");
  ASSERT_TRUE(total.ok());
  auto cond_fn = cond.Build({*cond.Binary(OpKind::kLt, *total, limit)});
  ASSERT_TRUE(cond_fn.ok()) << cond_fn.status();
  FunctionBuilder b("f", "i");
  const int32_t c0 = b.Parameter(DType::kF32, {});
  const int32_t k0 = b.Parameter(DType::kI32, {});
  const int32_t l0 = b.Parameter(DType::kF32, {});
  auto r = b.WhileResults(*cond_fn, DoubleBody(), {c0, k0, l0}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  auto ir = b.Build(*r);
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_EQ((*ir)->nesting_depth(), 2);
  EXPECT_TRUE((*ir)->has_collectives());  // the cond's psum counts
  // Too deep: a scan over a body that nests kMaxNestingDepth - 1 loops.
  std::shared_ptr<const FunctionIr> body = *inc_fn;
  for (int depth = 1; depth < kMaxNestingDepth; ++depth) {
    FunctionBuilder wrap("inc", "");
    const int32_t wv = wrap.Parameter(DType::kF32, {});
    auto wr = wrap.ScanResults(body, {wv}, 1, 0, 1, false);
    ASSERT_TRUE(wr.ok());
    body = *wrap.Build(*wr);
  }
  ASSERT_EQ(body->nesting_depth(), kMaxNestingDepth - 1);
  FunctionBuilder deep("double", "");
  const int32_t dc = deep.Parameter(DType::kF32, {});
  const int32_t dk = deep.Parameter(DType::kI32, {});
  deep.Parameter(DType::kF32, {});
  auto dr = deep.ScanResults(body, {dc}, 1, 0, 1, false);
  ASSERT_TRUE(dr.ok()) << dr.status();
  auto deep_fn = deep.Build({(*dr)[0], dk});
  ASSERT_TRUE(deep_fn.ok());
  ASSERT_EQ((*deep_fn)->nesting_depth(), kMaxNestingDepth);
  FunctionBuilder f("f", "");
  const int32_t a = f.Parameter(DType::kF32, {});
  const int32_t bk = f.Parameter(DType::kI32, {});
  const int32_t bl = f.Parameter(DType::kF32, {});
  ExpectInvalid(f.While(LessCond(), *deep_fn, {a, bk, bl}, 2).status(),
                absl::StrCat("while of @less and @double: loops nest ", kMaxNestingDepth + 1,
                             " deep, more than the ", kMaxNestingDepth, " allowed"));
}

// Folded converts give the kernels' answers (kernel_util.h's ToUint32):
// float to uint32 saturates, NaN gives 0; integers keep their bits.
TEST(FunctionIrTest, ConvertOfAConstantToAndFromUint32Folds) {
  FunctionBuilder b("c", "");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto c = b.Constant(DType::kF64, {6}, Bytes<double>({nan, 3.7, -0.5, -7.0, 1e10, 4294967295.0}));
  auto k = b.Constant(DType::kI32, {2}, Bytes<int32_t>({-1, 5}));
  ASSERT_TRUE(c.ok() && k.ok());
  auto u = b.Convert(*c, DType::kU32);
  auto ku = b.Convert(*k, DType::kU32);
  ASSERT_TRUE(u.ok() && ku.ok());
  auto back = b.Convert(*ku, DType::kF64);
  ASSERT_TRUE(back.ok());
  auto ir = b.Build({*u, *ku, *back});
  ASSERT_TRUE(ir.ok());
  for (int32_t v : {*u, *ku, *back}) EXPECT_EQ((*ir)->ops()[v].kind, OpKind::kConstant);
  std::vector<uint32_t> got(6);
  std::memcpy(got.data(), (*ir)->ops()[*u].literal.data(), 24);
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 3, 0, 0, 4294967295u, 4294967295u}));
  std::memcpy(got.data(), (*ir)->ops()[*ku].literal.data(), 8);
  EXPECT_EQ(got[0], 4294967295u);
  EXPECT_EQ(got[1], 5u);
  double d[2];
  std::memcpy(d, (*ir)->ops()[*back].literal.data(), 16);
  EXPECT_EQ(d[0], 4294967295.0);
  EXPECT_TRUE(absl::StrContains((*ir)->ToText(), "const u32[2] [4294967295, 5]")) << (*ir)->ToText();
}

// --- bfloat16: storage in bfloat16, compute in float32 ------------------------

// The type of a builder result, or "error: <message>".
std::string TypeOf(const FunctionBuilder& b, const absl::StatusOr<int32_t>& v) {
  return v.ok() ? b.type(*v).ToString() : absl::StrCat("error: ", v.status().message());
}

TEST(FunctionBuilderBFloat16Test, PromotionAsJax) {
  FunctionBuilder b("f", "i");
  const int32_t h = b.Parameter(DType::kBF16, {2});
  const int32_t f = b.Parameter(DType::kF32, {2});
  const int32_t d = b.Parameter(DType::kF64, {2});
  const int32_t i = b.Parameter(DType::kI32, {2});
  const int32_t u = b.Parameter(DType::kU32, {2});
  const int32_t p = b.Parameter(DType::kBool, {2});
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kAdd, h, h)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kAdd, h, f)), "f32[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kMul, d, h)), "f64[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kSub, h, i)), "bf16[2]");  // not f64, as float32's
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kSub, u, h)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kMax, p, h)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kDiv, h, i)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kPow, h, p)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Binary(OpKind::kLe, h, i)), "pred[2]");
  EXPECT_EQ(TypeOf(b, b.Unary(OpKind::kExp, h)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Unary(OpKind::kAbs, h)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Select(p, h, i)), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Select(p, h, f)), "f32[2]");
  EXPECT_EQ(TypeOf(b, b.Reduce(ReduceKind::kSum, h, nullptr, false)), "bf16[]");
  EXPECT_EQ(TypeOf(b, b.Reduce(ReduceKind::kMean, h, nullptr, true)), "bf16[1]");
  EXPECT_EQ(TypeOf(b, b.Reduce(ReduceKind::kArgmax, h, nullptr, false)), "i32[]");
  EXPECT_EQ(TypeOf(b, b.Psum(h, "i")), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.Pcollective(OpKind::kPmean, h, "i")), "bf16[2]");
  EXPECT_EQ(TypeOf(b, b.TopK(h, 1)), "i32[1]");
  EXPECT_EQ(TypeOf(b, b.Concatenate(std::vector<int32_t>{h, i, p}, 0)), "bf16[6]");
  EXPECT_EQ(TypeOf(b, b.Concatenate(std::vector<int32_t>{h, f}, 0)), "f32[4]");
}

TEST(FunctionBuilderBFloat16Test, TypeErrorsNameTheOp) {
  FunctionBuilder b("f", "");
  const int32_t h = b.Parameter(DType::kBF16, {2});
  const int32_t i = b.Parameter(DType::kI32, {2});
  for (OpKind kind : {OpKind::kAnd, OpKind::kShiftLeft}) {
    auto r = b.Binary(kind, h, i);
    EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kUnsupportedType) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "bf16[2]")) << r.status();
  }
  auto inv = b.Unary(OpKind::kNot, h);
  EXPECT_EQ(GetErrorKind(inv.status()), ErrorKind::kUnsupportedType) << inv.status();
  auto bits = b.BitcastConvert(h, DType::kI32);
  EXPECT_EQ(GetErrorKind(bits.status()), ErrorKind::kUnsupportedType) << bits.status();
  auto take = b.Take(i, h, 0);
  EXPECT_EQ(take.status().message(), "take: indices must be int32, got bf16[2]");
  auto parsed = DTypeFromName("float16");
  EXPECT_TRUE(absl::StrContains(parsed.status().message(),
                                "float32, float64, int32, bool, uint32, bfloat16"))
      << parsed.status();
}

// The text shows what the kernels run: each op on bfloat16 between a widening
// convert (shared by every op that reads the value) and a rounding one.
TEST(FunctionBuilderBFloat16Test, OpsComputeInFloat32AndRoundOnce) {
  FunctionBuilder b("f", "i");
  const int32_t h = b.Parameter(DType::kBF16, {3});
  const int32_t k = b.Parameter(DType::kI32, {3});
  auto sq = b.Binary(OpKind::kMul, h, h);
  ASSERT_TRUE(sq.ok());
  auto sum = b.Binary(OpKind::kAdd, *sq, h);
  ASSERT_TRUE(sum.ok());
  auto mixed = b.Binary(OpKind::kSub, k, h);
  ASSERT_TRUE(mixed.ok());
  auto lt = b.Binary(OpKind::kLt, h, *sum);
  ASSERT_TRUE(lt.ok());
  auto total = b.Reduce(ReduceKind::kSum, *sum, nullptr, false);
  ASSERT_TRUE(total.ok());
  auto ps = b.Psum(*total, "i");
  ASSERT_TRUE(ps.ok());
  auto ir = b.Build({*sum, *mixed, *lt, *ps});
  ASSERT_TRUE(ir.ok());
  EXPECT_EQ((*ir)->ToText(),
            "func @f(%0: bf16[3], %1: i32[3]) axis=i {\n"
            "  %2 = convert %0 : f32[3]\n"
            "  %3 = mul %2, %2 : f32[3]\n"
            "  %4 = convert %3 : bf16[3]\n"
            "  %5 = convert %4 : f32[3]\n"
            "  %6 = add %5, %2 : f32[3]\n"  // %0 widened once
            "  %7 = convert %6 : bf16[3]\n"
            "  %8 = convert %1 : bf16[3]\n"  // int32 rounds to bfloat16 first, as JAX
            "  %9 = convert %8 : f32[3]\n"
            "  %10 = sub %9, %2 : f32[3]\n"
            "  %11 = convert %10 : bf16[3]\n"
            "  %12 = convert %7 : f32[3]\n"
            "  %13 = lt %2, %12 : pred[3]\n"  // a comparison's bools need no rounding
            "  %14 = sum[axes=(0)] %12 : f32[]\n"  // accumulated in float32
            "  %15 = convert %14 : bf16[]\n"
            "  %16 = convert %15 : f32[]\n"
            "  %17 = psum[i] %16 : f32[]\n"
            "  %18 = convert %17 : bf16[]\n"
            "  return %7, %11, %13, %18\n"
            "}\n");
}

TEST(FunctionBuilderBFloat16Test, MatmulTopKAndScatterComputeInFloat32) {
  FunctionBuilder b("f", "");
  const int32_t a = b.Parameter(DType::kBF16, {2, 3});
  const int32_t w = b.Parameter(DType::kI32, {3, 4});
  auto m = b.Matmul(a, w);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(b.type(*m).ToString(), "bf16[2,4]");
  auto top = b.TopK(a, 2);
  ASSERT_TRUE(top.ok());
  const int32_t idx = *b.Constant(DType::kI32, {2}, Bytes<int32_t>({1, 1}));
  auto scattered = b.ScatterAdd(a, idx, 0, 3);
  ASSERT_TRUE(scattered.ok());
  EXPECT_EQ(b.type(*scattered).ToString(), "bf16[3,3]");
  auto ir = b.Build({*m, *top, *scattered});
  ASSERT_TRUE(ir.ok());
  const std::string text = (*ir)->ToText();
  // %3: a widened; %4: w rounded to bfloat16, then widened.
  EXPECT_TRUE(absl::StrContains(text, "matmul %3, %4 : f32[2,4]\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "top_k[k=2] %3 : i32[2,2]\n")) << text;
  // scatter_add is a scatter into a zero (%9, folded widened to %10).
  EXPECT_TRUE(absl::StrContains(text, "scatter[add,axis=0] %10, %8, %3 : f32[3,3]\n")) << text;
  // Every op but the sources and converts reads and writes only other types.
  for (const Op& op : (*ir)->ops()) {
    if (op.kind == OpKind::kConvert || op.kind == OpKind::kParameter ||
        op.kind == OpKind::kConstant) {
      continue;
    }
    EXPECT_NE(op.type.dtype, DType::kBF16) << OpKindName(op.kind);
    for (int32_t u : op.operands) {
      EXPECT_NE((*ir)->ops()[u].type.dtype, DType::kBF16) << OpKindName(op.kind);
    }
  }
}

// A bfloat16 constant folds through converts with the kernels' rounding,
// and prints with the fewest digits that read back as the same bfloat16.
TEST(FunctionBuilderBFloat16Test, ConstantsFoldAndPrint) {
  FunctionBuilder b("c", "");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto c = b.Constant(DType::kF32, {6},
                      Bytes<float>({0.1f, 1.0f + 0x1p-8f, -nan, 3.4e38f, -0.0f, 257}));
  ASSERT_TRUE(c.ok());
  auto h = b.Convert(*c, DType::kBF16);
  ASSERT_TRUE(h.ok());
  auto back = b.Convert(*h, DType::kF64);
  auto k = b.Convert(*h, DType::kI32);
  ASSERT_TRUE(back.ok() && k.ok());
  auto big = b.Constant(DType::kI32, {1}, Bytes<int32_t>({16777217}));
  ASSERT_TRUE(big.ok());
  auto hb = b.Convert(*big, DType::kBF16);
  ASSERT_TRUE(hb.ok());
  auto ir = b.Build({*h, *back, *k, *hb});
  ASSERT_TRUE(ir.ok());
  for (int32_t v : {*h, *back, *k, *hb}) EXPECT_EQ((*ir)->ops()[v].kind, OpKind::kConstant);
  std::vector<uint16_t> bits(6);
  std::memcpy(bits.data(), (*ir)->ops()[*h].literal.data(), 12);
  EXPECT_EQ(bits, (std::vector<uint16_t>{0x3dcd, 0x3f80, 0xffc0, 0x7f80, 0x8000, 0x4380}));
  double d[6];
  std::memcpy(d, (*ir)->ops()[*back].literal.data(), 48);
  EXPECT_EQ(d[0], 0.10009765625);
  EXPECT_TRUE(std::isnan(d[2]) && std::signbit(d[2]));
  EXPECT_EQ(d[5], 256.0);  // 257 is a tie between 256 and 258: even
  int32_t ints[6];
  std::memcpy(ints, (*ir)->ops()[*k].literal.data(), 24);
  EXPECT_EQ(ints[0], 0);
  EXPECT_EQ(ints[2], std::numeric_limits<int32_t>::min());
  uint16_t big_bits;
  std::memcpy(&big_bits, (*ir)->ops()[*hb].literal.data(), 2);
  EXPECT_EQ(big_bits, 0x4b80);  // 2^24
  const std::string text = (*ir)->ToText();
  EXPECT_TRUE(absl::StrContains(text, "const bf16[6] [0.1, 1, nan, inf, ...]")) << text;
  EXPECT_TRUE(absl::StrContains(text, "const bf16[1] [1.68e+07]")) << text;
}

}  // namespace
}  // namespace pw
