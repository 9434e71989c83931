#include "csrc/kernels/function_executable.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "csrc/base/allocation_counter.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/mutex.h"
#include "csrc/base/status_macros.h"
#include "csrc/kernels/linalg.h"
#include "csrc/kernels/vector_math.h"
#include "gtest/gtest.h"


namespace pw {
namespace {

constexpr int kShardCounts[] = {1, 2, 3, 8};

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Distinct, nonzero values for every element of every shard.
template <typename T>
std::vector<T> Iota(int num_shards, int64_t n, T start, T step) {
  std::vector<T> v(num_shards * n);
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * static_cast<T>(i);
  return v;
}

struct alignas(64) Block {
  uint8_t bytes[64];
};

// Runs `exe` on a gang with the given inputs (all shards, shard-major) and
// returns the outputs. Scratch and outputs start as garbage (NaN bytes), so
// reading an unwritten value shows up in the results.
std::vector<std::vector<uint8_t>> RunGang(const FunctionExecutable& exe, int num_shards,
                                          const std::vector<std::vector<uint8_t>>& inputs,
                                          int64_t* allocations = nullptr, uint8_t garbage = 0xff) {
  EXPECT_EQ(static_cast<int>(inputs.size()), exe.ir().num_params());
  std::vector<const void*> in;
  for (int i = 0; i < exe.ir().num_params(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(inputs[i].size()), exe.param_bytes(i) * num_shards);
    in.push_back(inputs[i].data());
  }
  std::vector<std::vector<uint8_t>> outputs;
  std::vector<void*> out;
  for (int i = 0; i < exe.ir().num_outputs(); ++i) {
    outputs.emplace_back(exe.output_bytes(i) * num_shards, garbage);
  }
  for (auto& o : outputs) out.push_back(o.data());
  std::vector<Block> scratch((exe.scratch_bytes(num_shards) + 63) / 64);
  if (!scratch.empty()) std::memset(scratch.data(), garbage, scratch.size() * sizeof(Block));

  StartCountingAllocations();
  exe.Run(num_shards, in, out, scratch.data());
  const int64_t counted = StopCountingAllocations();
  if (allocations != nullptr) *allocations = counted;
  return outputs;
}

template <typename T>
void ExpectValuesNear(const std::vector<T>& actual, const std::vector<T>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    if constexpr (sizeof(T) == 8) {
      EXPECT_DOUBLE_EQ(actual[i], expected[i]) << "element " << i;
    } else {
      EXPECT_FLOAT_EQ(actual[i], expected[i]) << "element " << i;
    }
  }
}

std::shared_ptr<const FunctionExecutable> MustCompile(
    absl::StatusOr<std::shared_ptr<const FunctionIr>> ir) {
  EXPECT_TRUE(ir.ok()) << ir.status();
  if (!ir.ok()) return nullptr;
  auto exe = FunctionExecutable::Compile(*std::move(ir));
  EXPECT_TRUE(exe.ok()) << exe.status();
  return exe.ok() ? *exe : nullptr;
}

template <typename T>
int32_t ScalarConstant(FunctionBuilder& b, T value) {
  auto c = b.Constant(DTypeOf<T>(), {}, Bytes<T>({value}));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

template <typename T>
class FunctionExecutableTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FunctionExecutableTest, ElementTypes);

TYPED_TEST(FunctionExecutableTest, BinaryOfTwoParams) {
  using T = TypeParam;
  const OpKind kinds[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv};
  const std::function<T(T, T)> fns[] = {std::plus<T>(), std::minus<T>(), std::multiplies<T>(),
                                        std::divides<T>()};
  constexpr int64_t n = 5;
  for (int k = 0; k < 4; ++k) {
    FunctionBuilder b("f", "");
    const int32_t x = b.Parameter(DTypeOf<T>(), {n});
    const int32_t y = b.Parameter(DTypeOf<T>(), {n});
    auto r = b.Binary(kinds[k], x, y);
    ASSERT_TRUE(r.ok());
    auto exe = MustCompile(b.Build({*r}));
    ASSERT_NE(exe, nullptr);
    for (int shards : kShardCounts) {
      SCOPED_TRACE(testing::Message() << OpKindName(kinds[k]) << " shards=" << shards);
      const auto xs = Iota<T>(shards, n, T(1.5), T(0.75));
      const auto ys = Iota<T>(shards, n, T(-3), T(0.5));
      std::vector<T> expected(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) expected[i] = fns[k](xs[i], ys[i]);
      const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ys)});
      ExpectValuesNear(Values<T>(out[0]), expected);
    }
  }
}

TYPED_TEST(FunctionExecutableTest, ScalarConstantOnEitherSide) {
  using T = TypeParam;
  constexpr int64_t n = 7;
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DTypeOf<T>(), {n});
  const int32_t two = ScalarConstant<T>(b, 2);
  auto left = b.Binary(OpKind::kSub, two, x);   // 2 - x
  auto right = b.Binary(OpKind::kSub, x, two);  // x - 2
  auto quot = b.Binary(OpKind::kDiv, two, x);   // 2 / x
  ASSERT_TRUE(left.ok() && right.ok() && quot.ok());
  auto exe = MustCompile(b.Build({*left, *right, *quot}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    const auto xs = Iota<T>(shards, n, T(0.5), T(1.25));
    std::vector<T> l, r, q;
    for (T v : xs) {
      l.push_back(T(2) - v);
      r.push_back(v - T(2));
      q.push_back(T(2) / v);
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs)});
    ExpectValuesNear(Values<T>(out[0]), l);
    ExpectValuesNear(Values<T>(out[1]), r);
    ExpectValuesNear(Values<T>(out[2]), q);
  }
}

// A per-shard scalar (a parameter, not a constant) broadcasts within its own
// shard only.
TYPED_TEST(FunctionExecutableTest, PerShardScalarBroadcast) {
  using T = TypeParam;
  constexpr int64_t n = 3;
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DTypeOf<T>(), {n});
  const int32_t s = b.Parameter(DTypeOf<T>(), {});
  auto xs_minus = b.Binary(OpKind::kSub, x, s);
  auto s_minus = b.Binary(OpKind::kSub, s, x);
  auto ss = b.Binary(OpKind::kMul, s, s);
  ASSERT_TRUE(xs_minus.ok() && s_minus.ok() && ss.ok());
  auto exe = MustCompile(b.Build({*xs_minus, *s_minus, *ss}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    const auto xv = Iota<T>(shards, n, T(1), T(1));
    const auto sv = Iota<T>(shards, 1, T(10), T(100));
    std::vector<T> e0, e1, e2;
    for (int sh = 0; sh < shards; ++sh) {
      for (int64_t j = 0; j < n; ++j) {
        e0.push_back(xv[sh * n + j] - sv[sh]);
        e1.push_back(sv[sh] - xv[sh * n + j]);
      }
      e2.push_back(sv[sh] * sv[sh]);
    }
    const auto out = RunGang(*exe, shards, {Bytes(xv), Bytes(sv)});
    ExpectValuesNear(Values<T>(out[0]), e0);
    ExpectValuesNear(Values<T>(out[1]), e1);
    ExpectValuesNear(Values<T>(out[2]), e2);
  }
}

TYPED_TEST(FunctionExecutableTest, NegAndVectorConstant) {
  using T = TypeParam;
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DTypeOf<T>(), {4});
  auto c = b.Constant(DTypeOf<T>(), {4}, Bytes<T>({1, -2, 3, -4}));
  ASSERT_TRUE(c.ok());
  auto neg = b.Unary(OpKind::kNeg, x);
  ASSERT_TRUE(neg.ok());
  auto plus = b.Binary(OpKind::kAdd, *neg, *c);
  auto neg_c = b.Unary(OpKind::kNeg, *c);
  ASSERT_TRUE(plus.ok() && neg_c.ok());
  auto exe = MustCompile(b.Build({*neg, *plus, *c, *neg_c}));
  ASSERT_NE(exe, nullptr);
  const std::vector<T> cv = {1, -2, 3, -4};
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    const auto xs = Iota<T>(shards, 4, T(-2.5), T(0.5));
    std::vector<T> e_neg, e_plus, e_c, e_neg_c;
    for (size_t i = 0; i < xs.size(); ++i) {
      e_neg.push_back(-xs[i]);
      e_plus.push_back(-xs[i] + cv[i % 4]);
      e_c.push_back(cv[i % 4]);
      e_neg_c.push_back(-cv[i % 4]);
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs)});
    ExpectValuesNear(Values<T>(out[0]), e_neg);
    ExpectValuesNear(Values<T>(out[1]), e_plus);
    ExpectValuesNear(Values<T>(out[2]), e_c);
    ExpectValuesNear(Values<T>(out[3]), e_neg_c);
  }
}

TYPED_TEST(FunctionExecutableTest, PsumOverShards) {
  using T = TypeParam;
  constexpr int64_t n = 6;
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DTypeOf<T>(), {n});
  const int32_t s = b.Parameter(DTypeOf<T>(), {});
  auto px = b.Psum(x, "i");
  auto doubled = b.Binary(OpKind::kMul, x, ScalarConstant<T>(b, 2));
  ASSERT_TRUE(doubled.ok());
  auto pd = b.Psum(*doubled, "i");
  auto ps = b.Psum(s, "i");
  auto pc = b.Psum(ScalarConstant<T>(b, 0.25), "i");
  ASSERT_TRUE(px.ok() && pd.ok() && ps.ok() && pc.ok());
  auto exe = MustCompile(b.Build({*px, *pd, *ps, *pc}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    const auto xs = Iota<T>(shards, n, T(0.125), T(1.5));
    const auto sv = Iota<T>(shards, 1, T(3), T(-1));
    std::vector<T> sum(n, 0), sum2(n, 0);
    T ssum = 0;
    for (int sh = 0; sh < shards; ++sh) {
      for (int64_t j = 0; j < n; ++j) {
        sum[j] += xs[sh * n + j];
        sum2[j] += xs[sh * n + j] * T(2);
      }
      ssum += sv[sh];
    }
    std::vector<T> e_x, e_d, e_s, e_c;
    for (int sh = 0; sh < shards; ++sh) {
      e_x.insert(e_x.end(), sum.begin(), sum.end());
      e_d.insert(e_d.end(), sum2.begin(), sum2.end());
      e_s.push_back(ssum);
      e_c.push_back(T(0.25) * shards);
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(sv)});
    ExpectValuesNear(Values<T>(out[0]), e_x);
    ExpectValuesNear(Values<T>(out[1]), e_d);
    ExpectValuesNear(Values<T>(out[2]), e_s);
    ExpectValuesNear(Values<T>(out[3]), e_c);
  }
}

TYPED_TEST(FunctionExecutableTest, OutputsMayBeParamsAndRepeat) {
  using T = TypeParam;
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DTypeOf<T>(), {2, 2});
  auto sq = b.Binary(OpKind::kMul, x, x);
  ASSERT_TRUE(sq.ok());
  auto exe = MustCompile(b.Build({x, *sq, *sq, x}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    const auto xs = Iota<T>(shards, 4, T(-1), T(0.5));
    std::vector<T> e_sq;
    for (T v : xs) e_sq.push_back(v * v);
    const auto out = RunGang(*exe, shards, {Bytes(xs)});
    ExpectValuesNear(Values<T>(out[0]), xs);
    ExpectValuesNear(Values<T>(out[1]), e_sq);
    ExpectValuesNear(Values<T>(out[2]), e_sq);
    ExpectValuesNear(Values<T>(out[3]), xs);
  }
}

// Figure 2's per-shard body: ((x * 2) + 1) / 2.
TYPED_TEST(FunctionExecutableTest, Figure2Chain) {
  using T = TypeParam;
  constexpr int64_t n = 9;
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DTypeOf<T>(), {n});
  auto m = b.Binary(OpKind::kMul, x, ScalarConstant<T>(b, 2));
  ASSERT_TRUE(m.ok());
  auto a = b.Binary(OpKind::kAdd, *m, ScalarConstant<T>(b, 1));
  ASSERT_TRUE(a.ok());
  auto d = b.Binary(OpKind::kDiv, *a, ScalarConstant<T>(b, 2));
  ASSERT_TRUE(d.ok());
  auto exe = MustCompile(b.Build({*d}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    const auto xs = Iota<T>(shards, n, T(-4), T(0.3));
    std::vector<T> expected;
    for (T v : xs) expected.push_back((v * T(2) + T(1)) / T(2));
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
    ExpectValuesNear(Values<T>(out[0]), expected);
    EXPECT_EQ(allocations, 0);
  }
}

// A matmul reads a transpose of its operands' last two dims in place (BLAS
// trans flags), with batch dims, whether or not the transpose is also
// needed elsewhere (then it runs too); the products equal a naive loop's.
TEST(FunctionExecutableMatmulTest, TransposedOperandsAreReadInPlace) {
  for (bool transpose_is_output : {false, true}) {
    SCOPED_TRACE(transpose_is_output);
    FunctionBuilder b("f", "i");
    const int32_t x = b.Parameter(DType::kF32, {2, 3, 4});  // x^T: [2, 4, 3]
    const int32_t y = b.Parameter(DType::kF32, {2, 5, 3});  // y^T: [2, 3, 5]
    const int32_t xt = *b.Transpose(x, {0, 2, 1});
    const int32_t yt = *b.Transpose(y, {0, 2, 1});
    const int32_t p = *b.Matmul(xt, yt);  // [2, 4, 5]
    std::vector<int32_t> outputs = {p};
    if (transpose_is_output) outputs.push_back(xt);
    auto exe = MustCompile(b.Build(outputs));
    ASSERT_NE(exe, nullptr);
    if (!transpose_is_output) {  // the transposes take no scratch: only p does (160 B, aligned)
      EXPECT_EQ(exe->scratch_bytes(1), 192);
    }
    const int shards = 2;
    const std::vector<float> xs = Iota<float>(shards, 24, 0.5f, 0.25f);
    const std::vector<float> ys = Iota<float>(shards, 30, -3.f, 0.125f);
    const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ys)});
    const std::vector<float> got = Values<float>(out[0]);
    for (int s = 0; s < shards; ++s) {
      for (int bt = 0; bt < 2; ++bt) {
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 5; ++j) {
            float want = 0;
            for (int k = 0; k < 3; ++k) {
              want += xs[s * 24 + bt * 12 + k * 4 + i] * ys[s * 30 + bt * 15 + j * 3 + k];
            }
            EXPECT_FLOAT_EQ(got[s * 40 + bt * 20 + i * 5 + j], want) << s << bt << i << j;
          }
        }
      }
    }
    if (transpose_is_output) {
      const std::vector<float> t = Values<float>(out[1]);
      EXPECT_EQ(t[1], xs[4]);  // x^T[0, 0, 1] = x[0, 1, 0]
    }
  }
}

// A reshape of a value that dies at it shares the value's scratch slot
// (nothing runs); one of a value read later gets a slot of its own. Both
// give the reshaped bytes, on every shard.
TEST(FunctionExecutableReshapeTest, AReshapeOfADyingValueSharesItsSlot) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {4, 6});
  const int32_t y = *b.Unary(OpKind::kNeg, x);               // [4, 6]
  const int32_t r = *b.Reshape(y, {6, 4});                   // y dies here: aliased
  const int32_t z = *b.Unary(OpKind::kNeg, r);               // [6, 4]
  const int32_t r2 = *b.Reshape(z, {24});                    // z read again below: a copy
  const int32_t w = *b.Binary(OpKind::kAdd, z, z);           // [6, 4]
  auto exe = MustCompile(b.Build({r2, w, r}));
  ASSERT_NE(exe, nullptr);
  {  // neg then reshape alone: one slot of 96 B (128 aligned), not two
    FunctionBuilder b1("g", "");
    const int32_t x1 = b1.Parameter(DType::kF32, {4, 6});
    auto exe1 = MustCompile(b1.Build({*b1.Reshape(*b1.Unary(OpKind::kNeg, x1), {24})}));
    ASSERT_NE(exe1, nullptr);
    EXPECT_EQ(exe1->scratch_bytes(1), 128);
  }
  const int shards = 3;
  const std::vector<float> xs = Iota<float>(shards, 24, 1.f, 1.f);
  const auto out = RunGang(*exe, shards, {Bytes(xs)});
  EXPECT_EQ(Values<float>(out[0]), xs);  // r2 = -(-x) flattened
  const std::vector<float> rv = Values<float>(out[2]);
  const std::vector<float> wv = Values<float>(out[1]);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(rv[i], -xs[i]);
    EXPECT_EQ(wv[i], 2 * xs[i]);
  }
}

// Every elementwise op of the registry has a kernel for every dtype its type
// rule takes: the kernels' switches have defaults, so an op added to the
// registry without its case would leave its output unwritten. Each is run
// twice over outputs of different garbage (0xff and 0x00 bytes): the results
// agree only where they were written.
TEST(FunctionExecutableRegistryTest, EveryElementwiseOpHasAKernel) {
  for (const OpInfo& info : kOpRegistry) {
    if (!IsBinaryOp(info.kind) && !IsUnaryOp(info.kind)) continue;
    for (DType dtype :
         {DType::kF32, DType::kF64, DType::kI32, DType::kU32, DType::kBool, DType::kBF16}) {
      SCOPED_TRACE(absl::StrCat(info.name, " ", DTypeName(dtype)));
      FunctionBuilder b("f", "i");
      const int32_t x = b.Parameter(dtype, {3});
      const int32_t y = b.Parameter(dtype, {3});
      auto r = IsBinaryOp(info.kind) ? b.Binary(info.kind, x, y) : b.Unary(info.kind, x);
      if (!r.ok()) {  // a dtype the op's rule refuses
        EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kUnsupportedType) << r.status();
        continue;
      }
      auto ir = b.Build({*r});
      ASSERT_TRUE(ir.ok()) << ir.status();
      auto exe = FunctionExecutable::Compile(*ir);
      ASSERT_TRUE(exe.ok()) << exe.status();
      std::vector<std::vector<uint8_t>> inputs;
      for (int p = 0; p < 2; ++p) {
        switch (dtype) {
          case DType::kBool:
            inputs.push_back({1, 0, 1, 1, 1, 0});
            break;
          case DType::kF32:
            inputs.push_back(Bytes(std::vector<float>{0.5f, 1.5f, 2.f, 0.75f, 1.f, 3.f}));
            break;
          case DType::kF64:
            inputs.push_back(Bytes(std::vector<double>{0.5, 1.5, 2., 0.75, 1., 3.}));
            break;
          case DType::kI32:
            inputs.push_back(Bytes(std::vector<int32_t>{1, 2, 3, 7, 1, 5}));
            break;
          case DType::kU32:
            inputs.push_back(Bytes(std::vector<uint32_t>{1, 2, 3, 7, 1, 5}));
            break;
          case DType::kBF16:  // computed in float32: Compile refuses it otherwise
            inputs.push_back(
                Bytes(std::vector<uint16_t>{0x3f00, 0x3fc0, 0x4000, 0x3f40, 0x3f80, 0x4040}));
            break;
        }
      }
      const std::vector<uint8_t> out = RunGang(**exe, 2, inputs)[0];
      EXPECT_EQ(RunGang(**exe, 2, inputs, nullptr, 0x00)[0], out);
      if ((*ir)->output_type(0).dtype == DType::kBool) {
        for (uint8_t v : out) EXPECT_LE(v, 1);
      }
    }
  }
}

TEST(FunctionExecutableMixedTest, ConvertF32AndF64Params) {
  constexpr int64_t n = 4;
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {n});
  const int32_t y = b.Parameter(DType::kF64, {n});
  auto sum = b.Binary(OpKind::kAdd, x, y);  // f64
  ASSERT_TRUE(sum.ok());
  auto narrow = b.Convert(*sum, DType::kF32);
  ASSERT_TRUE(narrow.ok());
  auto exe = MustCompile(b.Build({*sum, *narrow}));
  ASSERT_NE(exe, nullptr);
  EXPECT_EQ(exe->output_bytes(0), 32);
  EXPECT_EQ(exe->output_bytes(1), 16);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    // 0.1f widened is not 0.1: the sum must be computed from the f32 value.
    const auto xs = Iota<float>(shards, n, 0.1f, 0.2f);
    const auto ys = Iota<double>(shards, n, 1e-9, 1.0);
    std::vector<double> e_sum;
    std::vector<float> e_narrow;
    for (size_t i = 0; i < xs.size(); ++i) {
      e_sum.push_back(static_cast<double>(xs[i]) + ys[i]);
      e_narrow.push_back(static_cast<float>(e_sum.back()));
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ys)});
    const auto got_sum = Values<double>(out[0]);
    const auto got_narrow = Values<float>(out[1]);
    ASSERT_EQ(got_sum.size(), e_sum.size());
    for (size_t i = 0; i < e_sum.size(); ++i) {
      EXPECT_EQ(got_sum[i], e_sum[i]) << i;  // exact: one rounding either way
      EXPECT_EQ(got_narrow[i], e_narrow[i]) << i;
    }
  }
}

TEST(FunctionExecutableMixedTest, ScratchIsReusedAlongAChain) {
  FunctionBuilder b("f", "");
  int32_t v = b.Parameter(DType::kF32, {16});  // 64 bytes per value
  for (int i = 0; i < 10; ++i) {
    auto next = b.Unary(OpKind::kNeg, v);
    ASSERT_TRUE(next.ok());
    v = *next;
  }
  auto exe = MustCompile(b.Build({v}));
  ASSERT_NE(exe, nullptr);
  // The chain is one fusion group: only its result gets a full slot, and
  // the nine intermediates share two tile buffers (an op's operand and result).
  ASSERT_EQ(exe->fusion_groups().size(), 1u);
  const int64_t tiles = 2 * FunctionExecutable::kTileElements * 8;
  EXPECT_EQ(exe->scratch_bytes(1), 64 + tiles);
  EXPECT_EQ(exe->scratch_bytes(3), 3 * 64 + tiles);
  const auto xs = Iota<float>(3, 16, 1.0f, 1.0f);
  const auto out = RunGang(*exe, 3, {Bytes(xs)});
  ExpectValuesNear(Values<float>(out[0]), xs);  // ten negations
}

TEST(FunctionExecutableMixedTest, ConcurrentGangsWithOwnScratch) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kF64, {32});
  auto sq = b.Binary(OpKind::kMul, x, x);
  ASSERT_TRUE(sq.ok());
  auto p = b.Psum(*sq, "i");
  ASSERT_TRUE(p.ok());
  auto exe = MustCompile(b.Build({*p}));
  ASSERT_NE(exe, nullptr);
  constexpr int kShards = 4;
  const auto xs = Iota<double>(kShards, 32, 0.0, 1.0);
  const auto expected = Values<double>(RunGang(*exe, kShards, {Bytes(xs)})[0]);
  ASSERT_EQ(expected.size(), 4u * 32);
  EXPECT_DOUBLE_EQ(expected[0], 0.0 + 32 * 32 + 64 * 64 + 96 * 96);

  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<const void*> in = {xs.data()};
      for (int iter = 0; iter < 100; ++iter) {
        std::vector<double> out(kShards * 32);
        std::vector<Block> scratch((exe->scratch_bytes(kShards) + 63) / 64);
        void* outs[] = {out.data()};
        exe->Run(kShards, in, outs, scratch.data());
        if (out != expected) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// --- numpy broadcasting, int32, bool and the elementwise op set -----------

// Reference row-major broadcast index: the element of an operand of dims
// `od` read for element `j` of a result of dims `dims`.
int64_t BroadcastIndex(const Dims& dims, const Dims& od, int64_t j) {
  int64_t index = 0;
  int64_t stride = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    const size_t d = dims.size() - 1 - i;
    const int64_t coord = j % dims[d];
    j /= dims[d];
    if (i < od.size()) {
      const int64_t k = od.size() - 1 - i;
      if (od[k] != 1) index += coord * stride;
      stride *= od[k];
    }
  }
  return index;
}

TEST(FunctionExecutableBroadcastTest, BinaryBroadcastsParamsAndConstants) {
  struct Case {
    Dims a, b, out;
  };
  const Case cases[] = {
      {{2, 1, 3}, {4, 1}, {2, 4, 3}}, {{3}, {2, 3}, {2, 3}},   {{2, 3}, {2, 1}, {2, 3}},
      {{1}, {5}, {5}},                {{4, 1}, {1, 4}, {4, 4}}, {{2, 0}, {1, 1}, {2, 0}},
  };
  for (const Case& c : cases) {
    for (bool constant_b : {false, true}) {
      SCOPED_TRACE(testing::Message() << TypeToString(DType::kF64, c.a) << " - "
                                      << TypeToString(DType::kF64, c.b)
                                      << (constant_b ? " (constant)" : ""));
      const int64_t nb = NumElements(c.b);
      std::vector<double> cvals(nb);
      for (int64_t j = 0; j < nb; ++j) cvals[j] = 1000.0 * (j + 1);
      FunctionBuilder b("f", "");
      const int32_t x = b.Parameter(DType::kF64, c.a);
      int32_t y;
      if (constant_b) {
        auto k = b.Constant(DType::kF64, c.b, Bytes(cvals));
        ASSERT_TRUE(k.ok());
        y = *k;
      } else {
        y = b.Parameter(DType::kF64, c.b);
      }
      auto diff = b.Binary(OpKind::kSub, x, y);
      ASSERT_TRUE(diff.ok()) << diff.status();
      auto less = b.Binary(OpKind::kLt, y, x);
      ASSERT_TRUE(less.ok()) << less.status();
      auto exe = MustCompile(b.Build({*diff, *less}));
      ASSERT_NE(exe, nullptr);
      const int64_t na = NumElements(c.a);
      const int64_t n = NumElements(c.out);
      for (int shards : kShardCounts) {
        SCOPED_TRACE(testing::Message() << "shards=" << shards);
        const auto xs = Iota<double>(shards, na, 1.0, 1.0);
        const auto ys = constant_b ? std::vector<double>() : Iota<double>(shards, nb, 0.5, 3.0);
        std::vector<std::vector<uint8_t>> inputs = {Bytes(xs)};
        if (!constant_b) inputs.push_back(Bytes(ys));
        int64_t allocations = -1;
        const auto out = RunGang(*exe, shards, inputs, &allocations);
        EXPECT_EQ(allocations, 0);
        const auto got = Values<double>(out[0]);
        const auto got_less = Values<uint8_t>(out[1]);
        ASSERT_EQ(static_cast<int64_t>(got.size()), shards * n);
        for (int s = 0; s < shards; ++s) {
          for (int64_t j = 0; j < n; ++j) {
            const double xa = xs[s * na + BroadcastIndex(c.out, c.a, j)];
            const int64_t ib = BroadcastIndex(c.out, c.b, j);
            const double yb = constant_b ? cvals[ib] : ys[s * nb + ib];
            EXPECT_EQ(got[s * n + j], xa - yb) << "shard " << s << " element " << j;
            EXPECT_EQ(got_less[s * n + j], yb < xa ? 1 : 0) << "shard " << s << " element " << j;
          }
        }
      }
    }
  }
}

TEST(FunctionExecutableBroadcastTest, SelectBroadcastsAllThree) {
  FunctionBuilder b("f", "");
  const int32_t c = b.Parameter(DType::kBool, {2, 1});
  const int32_t x = b.Parameter(DType::kI32, {3});
  auto zero = b.Constant(DType::kF32, {}, Bytes<float>({-0.5f}));
  ASSERT_TRUE(zero.ok());
  auto w = b.Select(c, x, *zero);  // f64[2,3]
  ASSERT_TRUE(w.ok()) << w.status();
  auto exe = MustCompile(b.Build({*w}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    std::vector<uint8_t> cs;
    std::vector<int32_t> xs;
    for (int s = 0; s < shards; ++s) {
      cs.push_back(s % 2);
      cs.push_back(1);
      for (int j = 0; j < 3; ++j) xs.push_back(10 * s + j);
    }
    const auto got = Values<double>(RunGang(*exe, shards, {cs, Bytes(xs)})[0]);
    ASSERT_EQ(static_cast<int>(got.size()), shards * 6);
    for (int s = 0; s < shards; ++s) {
      for (int r = 0; r < 2; ++r) {
        for (int j = 0; j < 3; ++j) {
          const double expected = cs[s * 2 + r] ? 10.0 * s + j : -0.5;
          EXPECT_EQ(got[s * 6 + r * 3 + j], expected) << s << "," << r << "," << j;
        }
      }
    }
  }
}

TEST(FunctionExecutableElementwiseTest, Int32ArithmeticWrapsAndDividesInFloat) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kI32, {4});
  const int32_t y = b.Parameter(DType::kI32, {4});
  auto sum = b.Binary(OpKind::kAdd, x, y);
  auto quot = b.Binary(OpKind::kDiv, x, y);  // f64
  auto pw = b.Binary(OpKind::kPow, x, y);
  auto mx = b.Binary(OpKind::kMax, x, y);
  auto ab = b.Unary(OpKind::kAbs, x);
  auto ng = b.Unary(OpKind::kNeg, x);
  ASSERT_TRUE(sum.ok() && quot.ok() && pw.ok() && mx.ok() && ab.ok() && ng.ok());
  EXPECT_EQ(b.type(*quot).dtype, DType::kF64);
  auto exe = MustCompile(b.Build({*sum, *quot, *pw, *mx, *ab, *ng}));
  ASSERT_NE(exe, nullptr);
  const std::vector<int32_t> xv = {7, -9, 2147483647, 3};
  const std::vector<int32_t> yv = {2, 4, 1, 0};
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    std::vector<int32_t> xs, ys;
    for (int s = 0; s < shards; ++s) {
      xs.insert(xs.end(), xv.begin(), xv.end());
      ys.insert(ys.end(), yv.begin(), yv.end());
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ys)});
    const auto got_sum = Values<int32_t>(out[0]);
    const auto got_quot = Values<double>(out[1]);
    const auto got_pow = Values<int32_t>(out[2]);
    const auto got_max = Values<int32_t>(out[3]);
    const auto got_abs = Values<int32_t>(out[4]);
    const auto got_neg = Values<int32_t>(out[5]);
    for (int s = 0; s < shards; ++s) {
      const int o = 4 * s;
      EXPECT_EQ(got_sum[o + 0], 9);
      EXPECT_EQ(got_sum[o + 2], -2147483647 - 1);  // wraps, as numpy
      EXPECT_EQ(got_quot[o + 0], 3.5);
      EXPECT_EQ(got_quot[o + 1], -2.25);
      EXPECT_EQ(got_pow[o + 0], 49);
      EXPECT_EQ(got_pow[o + 1], 6561);
      EXPECT_EQ(got_pow[o + 3], 1);
      EXPECT_EQ(got_max[o + 1], 4);
      EXPECT_EQ(got_abs[o + 1], 9);
      EXPECT_EQ(got_neg[o + 0], -7);
    }
  }
}

// rem is C's: the sign of x, exact for floats (fmod); integers by zero give x
// (XLA's) and INT32_MIN rem -1 is 0 (C's % would trap); bools compute in int32.
// The bytes of `shards` copies of `h`, one per shard.
template <typename V>
std::vector<uint8_t> RepeatedBytes(const V& h, int shards) {
  V all;
  for (int s = 0; s < shards; ++s) all.insert(all.end(), h.begin(), h.end());
  return Bytes(all);
}

TEST(FunctionExecutableElementwiseTest, RemIsTruncatedInEveryDtype) {
  FunctionBuilder b("f", "");
  const int32_t i = b.Parameter(DType::kI32, {6});
  const int32_t j = b.Parameter(DType::kI32, {6});
  const int32_t u = b.Parameter(DType::kU32, {3});
  const int32_t v = b.Parameter(DType::kU32, {3});
  const int32_t f = b.Parameter(DType::kF64, {5});
  const int32_t g = b.Parameter(DType::kF64, {5});
  const int32_t p = b.Parameter(DType::kBool, {2});
  auto ri = b.Binary(OpKind::kRem, i, j);
  auto ru = b.Binary(OpKind::kRem, u, v);
  auto rf = b.Binary(OpKind::kRem, f, g);
  auto rb = b.Binary(OpKind::kRem, p, p);
  ASSERT_TRUE(ri.ok() && ru.ok() && rf.ok() && rb.ok());
  EXPECT_EQ(b.type(*rb).dtype, DType::kI32);
  EXPECT_EQ(b.type(*rf).dtype, DType::kF64);
  auto exe = MustCompile(b.Build({*ri, *ru, *rf, *rb}));
  ASSERT_NE(exe, nullptr);
  const std::vector<int32_t> iv = {7, -7, 7, std::numeric_limits<int32_t>::min(), 5, -9};
  const std::vector<int32_t> jv = {3, 3, -3, -1, 0, 9};
  const std::vector<uint32_t> uv = {7, 4294967295u, 5};
  const std::vector<uint32_t> vv = {3, 10, 0};
  const std::vector<double> fv = {5.5, -5.5, 1.0, 1e300, 3.0};
  const std::vector<double> gv = {2.0, 2.0, 0.1, 3.0, 0.0};
  const std::vector<uint8_t> pv = {1, 1};
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    auto rep = [&](const auto& h) { return RepeatedBytes(h, shards); };
    const auto out = RunGang(*exe, shards, {rep(iv), rep(jv), rep(uv), rep(vv), rep(fv), rep(gv),
                                            rep(pv)});
    const auto got_i = Values<int32_t>(out[0]);
    const auto got_u = Values<uint32_t>(out[1]);
    const auto got_f = Values<double>(out[2]);
    const auto got_b = Values<int32_t>(out[3]);
    for (int s = 0; s < shards; ++s) {
      const int32_t want_i[] = {1, -1, 1, 0, 5, -0};
      for (int k = 0; k < 6; ++k) EXPECT_EQ(got_i[6 * s + k], want_i[k]) << k;
      EXPECT_EQ(got_u[3 * s + 0], 1u);
      EXPECT_EQ(got_u[3 * s + 1], 5u);
      EXPECT_EQ(got_u[3 * s + 2], 5u);  // by zero: x
      for (int k = 0; k < 4; ++k) EXPECT_EQ(got_f[5 * s + k], std::fmod(fv[k], gv[k])) << k;
      EXPECT_TRUE(std::isnan(got_f[5 * s + 4]));  // fmod(x, 0) is NaN
      EXPECT_EQ(got_b[2 * s], 0);
    }
  }
}

// tan, the inverse and hyperbolic functions, atan2: C's in double, a float
// result rounded once; integers in float64, bool in float32 (as numpy).
TEST(FunctionExecutableElementwiseTest, TrigonometricFunctionsAreCsRoundedOnce) {
  const std::vector<double> dv = {0.0, -0.0, 0.5, -0.9, 1.0, 1.5, 10.0, 1e-30, 800.0,
                                  INFINITY, -INFINITY, NAN};
  const std::vector<float> fv(dv.begin(), dv.end());
  const std::vector<int32_t> iv = {0, 1, -1, 2, 3, -4};
  const int64_t n = static_cast<int64_t>(dv.size());
  const std::pair<OpKind, double (*)(double)> unary[] = {
      {OpKind::kTan, [](double v) { return std::tan(v); }},
      {OpKind::kAsin, [](double v) { return std::asin(v); }},
      {OpKind::kAcos, [](double v) { return std::acos(v); }},
      {OpKind::kAtan, [](double v) { return std::atan(v); }},
      {OpKind::kSinh, [](double v) { return std::sinh(v); }},
      {OpKind::kCosh, [](double v) { return std::cosh(v); }},
      {OpKind::kAsinh, [](double v) { return std::asinh(v); }},
      {OpKind::kAcosh, [](double v) { return std::acosh(v); }},
      {OpKind::kAtanh, [](double v) { return std::atanh(v); }},
  };
  FunctionBuilder b("f", "");
  const int32_t f = b.Parameter(DType::kF32, {n});
  const int32_t d = b.Parameter(DType::kF64, {n});
  const int32_t i = b.Parameter(DType::kI32, {6});
  const int32_t p = b.Parameter(DType::kBool, {2});
  std::vector<int32_t> outs;
  for (const auto& [kind, fn] : unary) {
    outs.push_back(*b.Unary(kind, f));
    outs.push_back(*b.Unary(kind, d));
    outs.push_back(*b.Unary(kind, i));
    EXPECT_EQ(b.type(outs.back()).dtype, DType::kF64);
  }
  outs.push_back(*b.Binary(OpKind::kAtan2, f, *b.Rev(f, {0})));
  outs.push_back(*b.Binary(OpKind::kAtan2, d, *b.Rev(d, {0})));
  outs.push_back(*b.Binary(OpKind::kAtan2, i, *b.Rev(i, {0})));
  EXPECT_EQ(b.type(outs.back()).dtype, DType::kF64);
  outs.push_back(*b.Binary(OpKind::kAtan2, p, p));
  EXPECT_EQ(b.type(outs.back()).dtype, DType::kF32);
  auto exe = MustCompile(b.Build(outs));
  ASSERT_NE(exe, nullptr);
  const std::vector<uint8_t> pv = {1, 0};
  // The same bits as the reference, NaN for NaN.
  auto same = [](double got, double want) {
    return std::isnan(want) ? std::isnan(got) : got == want && std::signbit(got) == std::signbit(want);
  };
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    auto rep = [&](const auto& h) { return RepeatedBytes(h, shards); };
    const auto out = RunGang(*exe, shards, {rep(fv), rep(dv), rep(iv), rep(pv)});
    size_t o = 0;
    for (const auto& [kind, fn] : unary) {
      SCOPED_TRACE(OpKindName(kind));
      const auto got_f = Values<float>(out[o++]);
      const auto got_d = Values<double>(out[o++]);
      const auto got_i = Values<double>(out[o++]);
      for (int s = 0; s < shards; ++s) {
        for (int64_t k = 0; k < n; ++k) {
          EXPECT_TRUE(same(got_f[n * s + k], static_cast<float>(fn(fv[k])))) << k;
          EXPECT_TRUE(same(got_d[n * s + k], fn(dv[k]))) << k;
        }
        for (int k = 0; k < 6; ++k) EXPECT_TRUE(same(got_i[6 * s + k], fn(iv[k]))) << k;
      }
    }
    SCOPED_TRACE("atan2");
    const auto got_f = Values<float>(out[o++]);
    const auto got_d = Values<double>(out[o++]);
    const auto got_i = Values<double>(out[o++]);
    const auto got_p = Values<float>(out[o++]);
    for (int s = 0; s < shards; ++s) {
      for (int64_t k = 0; k < n; ++k) {
        const double y = dv[k], x = dv[n - 1 - k];
        EXPECT_TRUE(same(got_f[n * s + k], static_cast<float>(std::atan2(y, x)))) << k;
        EXPECT_TRUE(same(got_d[n * s + k], std::atan2(y, x))) << k;
      }
      for (int k = 0; k < 6; ++k) EXPECT_TRUE(same(got_i[6 * s + k], std::atan2(iv[k], iv[5 - k]))) << k;
      EXPECT_EQ(got_p[2 * s], static_cast<float>(std::atan2(1.0, 1.0)));
      EXPECT_EQ(got_p[2 * s + 1], 0.0f);
    }
  }
}

TEST(FunctionExecutableElementwiseTest, Uint32ArithmeticWrapsAndConverts) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kU32, {4});
  const int32_t y = b.Parameter(DType::kU32, {4});
  auto sum = b.Binary(OpKind::kAdd, x, y);
  auto diff = b.Binary(OpKind::kSub, x, y);
  auto prod = b.Binary(OpKind::kMul, x, y);
  auto quot = b.Binary(OpKind::kDiv, x, y);  // f64
  auto pw = b.Binary(OpKind::kPow, x, y);
  auto mx = b.Binary(OpKind::kMax, x, y);
  auto lt = b.Binary(OpKind::kLt, x, y);
  auto ng = b.Unary(OpKind::kNeg, x);
  auto tof = b.Convert(x, DType::kF32);
  auto toi = b.Convert(x, DType::kI32);
  ASSERT_TRUE(sum.ok() && diff.ok() && prod.ok() && quot.ok() && pw.ok() && mx.ok() && lt.ok() &&
              ng.ok() && tof.ok() && toi.ok());
  auto exe = MustCompile(b.Build({*sum, *diff, *prod, *quot, *pw, *mx, *lt, *ng, *tof, *toi}));
  ASSERT_NE(exe, nullptr);
  const std::vector<uint32_t> xv = {7, 4294967295u, 2147483648u, 3};
  const std::vector<uint32_t> yv = {2, 1, 2147483648u, 21};
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    std::vector<uint32_t> xs, ys;
    for (int s = 0; s < shards; ++s) {
      xs.insert(xs.end(), xv.begin(), xv.end());
      ys.insert(ys.end(), yv.begin(), yv.end());
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ys)});
    const auto got_sum = Values<uint32_t>(out[0]);
    const auto got_diff = Values<uint32_t>(out[1]);
    const auto got_prod = Values<uint32_t>(out[2]);
    const auto got_quot = Values<double>(out[3]);
    const auto got_pow = Values<uint32_t>(out[4]);
    const auto got_max = Values<uint32_t>(out[5]);
    const auto& got_lt = out[6];
    const auto got_neg = Values<uint32_t>(out[7]);
    const auto got_f = Values<float>(out[8]);
    const auto got_i = Values<int32_t>(out[9]);
    for (int s = 0; s < shards; ++s) {
      const int o = 4 * s;
      EXPECT_EQ(got_sum[o + 1], 0u);  // wraps, as numpy
      EXPECT_EQ(got_sum[o + 2], 0u);
      EXPECT_EQ(got_diff[o + 0], 5u);
      EXPECT_EQ(got_diff[o + 3], 4294967278u);
      EXPECT_EQ(got_prod[o + 1], 4294967295u);
      EXPECT_EQ(got_prod[o + 2], 0u);
      EXPECT_EQ(got_quot[o + 1], 4294967295.0);
      EXPECT_EQ(got_quot[o + 0], 3.5);
      EXPECT_EQ(got_pow[o + 0], 49u);
      EXPECT_EQ(got_pow[o + 3], 1870418611u);  // 3**21 mod 2**32
      EXPECT_EQ(got_max[o + 1], 4294967295u);  // compared unsigned
      EXPECT_EQ(got_lt[o + 1], 0);
      EXPECT_EQ(got_lt[o + 3], 1);
      EXPECT_EQ(got_neg[o + 0], 4294967289u);
      EXPECT_EQ(got_f[o + 1], 4294967296.0f);
      EXPECT_EQ(got_i[o + 1], -1);
      EXPECT_EQ(got_i[o + 2], std::numeric_limits<int32_t>::min());
    }
  }
}

TEST(FunctionExecutableElementwiseTest, FloatToUint32TruncatesAndSaturates) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {8});
  const int32_t d = b.Parameter(DType::kF64, {8});
  auto u = b.Convert(x, DType::kU32);
  auto ud = b.Convert(d, DType::kU32);
  ASSERT_TRUE(u.ok() && ud.ok());
  auto exe = MustCompile(b.Build({*u, *ud}));
  ASSERT_NE(exe, nullptr);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {3.9f, -0.5f, -7.f, 4294967296.f, inf, -inf, std::nanf(""), 0.f};
  std::vector<double> ds(xs.begin(), xs.end());
  ds[3] = 4294967295.5;
  ds[7] = 4294967294.0;
  const auto out = RunGang(*exe, 1, {Bytes(xs), Bytes(ds)});
  EXPECT_EQ(Values<uint32_t>(out[0]),
            (std::vector<uint32_t>{3, 0, 0, 4294967295u, 4294967295u, 0, 0, 0}));
  EXPECT_EQ(Values<uint32_t>(out[1]),
            (std::vector<uint32_t>{3, 0, 0, 4294967295u, 4294967295u, 0, 0, 4294967294u}));
}

// Bitwise ops on both integer types and bool, and shifts with XLA's
// out-of-range counts, against a scalar reference.
TEST(FunctionExecutableElementwiseTest, BitwiseOpsAndShifts) {
  const std::vector<int32_t> xv = {-8, 0x12345678, 1, -1, std::numeric_limits<int32_t>::min(),
                                   5, -3, 0x7fffffff, 6};
  const std::vector<int32_t> nv = {1, 4, 31, 32, 33, -1, 0, 1000, 2};
  for (DType dtype : {DType::kI32, DType::kU32}) {
    SCOPED_TRACE(DTypeName(dtype));
    FunctionBuilder b("f", "");
    const int32_t x = b.Parameter(dtype, {9});
    const int32_t n = b.Parameter(dtype, {9});
    std::vector<int32_t> outs;
    for (OpKind kind : {OpKind::kAnd, OpKind::kOr, OpKind::kXor, OpKind::kShiftLeft,
                        OpKind::kShiftRightLogical, OpKind::kShiftRightArithmetic}) {
      auto v = b.Binary(kind, x, n);
      ASSERT_TRUE(v.ok()) << v.status();
      outs.push_back(*v);
    }
    auto inv = b.Unary(OpKind::kNot, x);
    ASSERT_TRUE(inv.ok()) << inv.status();
    outs.push_back(*inv);
    auto exe = MustCompile(b.Build(outs));
    ASSERT_NE(exe, nullptr);
    for (int shards : kShardCounts) {
      SCOPED_TRACE(testing::Message() << "shards=" << shards);
      std::vector<int32_t> xs, ns;
      for (int s = 0; s < shards; ++s) {
        xs.insert(xs.end(), xv.begin(), xv.end());
        ns.insert(ns.end(), nv.begin(), nv.end());
      }
      const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ns)});
      for (size_t i = 0; i < xs.size(); ++i) {
        const uint32_t a = static_cast<uint32_t>(xs[i]);
        const uint32_t c = static_cast<uint32_t>(ns[i]);
        const bool in_range = c < 32;
        const uint32_t sign_fill = xs[i] < 0 ? 0xffffffffu : 0u;
        const uint32_t expected[] = {
            a & c, a | c, a ^ c, in_range ? a << c : 0u, in_range ? a >> c : 0u,
            in_range ? static_cast<uint32_t>(xs[i] >> c) : sign_fill, ~a};
        for (size_t k = 0; k < 7; ++k) {
          EXPECT_EQ(Values<uint32_t>(out[k])[i], expected[k]) << "op " << k << " element " << i;
        }
      }
    }
  }
  FunctionBuilder b("f", "");
  const int32_t p = b.Parameter(DType::kBool, {4});
  const int32_t q = b.Parameter(DType::kBool, {4});
  auto a = b.Binary(OpKind::kAnd, p, q);
  auto o = b.Binary(OpKind::kOr, p, q);
  auto x = b.Binary(OpKind::kXor, p, q);
  auto n = b.Unary(OpKind::kNot, p);
  ASSERT_TRUE(a.ok() && o.ok() && x.ok() && n.ok());
  auto exe = MustCompile(b.Build({*a, *o, *x, *n}));
  ASSERT_NE(exe, nullptr);
  const auto out = RunGang(*exe, 1, {{0, 0, 1, 1}, {0, 1, 0, 1}});
  EXPECT_EQ(out[0], (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(out[1], (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(out[2], (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(out[3], (std::vector<uint8_t>{1, 1, 0, 0}));  // logical, not ~1 = 0xfe
}

TEST(FunctionExecutableElementwiseTest, BitcastConvertKeepsTheBits) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {4});
  auto u = b.BitcastConvert(x, DType::kU32);
  ASSERT_TRUE(u.ok());
  auto i = b.BitcastConvert(*u, DType::kI32);
  ASSERT_TRUE(i.ok());
  // JAX's uniform floats: mantissa bits under the exponent of 1.0, minus 1.
  auto shifted = b.Binary(OpKind::kShiftRightLogical, *u, ScalarConstant<uint32_t>(b, 9));
  ASSERT_TRUE(shifted.ok());
  auto one_bits = b.Binary(OpKind::kOr, *shifted, ScalarConstant<uint32_t>(b, 0x3f800000u));
  ASSERT_TRUE(one_bits.ok());
  auto f = b.BitcastConvert(*one_bits, DType::kF32);
  ASSERT_TRUE(f.ok());
  auto exe = MustCompile(b.Build({*u, *i, *f}));
  ASSERT_NE(exe, nullptr);
  const float nan = std::bit_cast<float>(0xffc00001u);
  const std::vector<float> xs = {1.0f, -0.0f, nan, -2.5f};
  for (int shards : kShardCounts) {
    std::vector<float> all;
    for (int s = 0; s < shards; ++s) all.insert(all.end(), xs.begin(), xs.end());
    const auto out = RunGang(*exe, shards, {Bytes(all)});
    const auto got_u = Values<uint32_t>(out[0]);
    const auto got_i = Values<int32_t>(out[1]);
    const auto got_f = Values<float>(out[2]);
    for (size_t k = 0; k < all.size(); ++k) {
      const uint32_t bits = std::bit_cast<uint32_t>(all[k]);
      EXPECT_EQ(got_u[k], bits);
      EXPECT_EQ(got_i[k], static_cast<int32_t>(bits));
      EXPECT_EQ(std::bit_cast<uint32_t>(got_f[k]), (bits >> 9) | 0x3f800000u);
    }
  }
}

// uint32 through the other kernels: reductions, collectives, top_k, take,
// matmul and data movement, compared unsigned and wrapping.
TEST(FunctionExecutableUint32Test, ReductionsCollectivesAndDataMovement) {
  FunctionBuilder b("f", "i");
  ASSERT_TRUE(b.SetAxisSize(2).ok());
  const int32_t x = b.Parameter(DType::kU32, {2, 3});
  auto sum = b.Reduce(ReduceKind::kSum, x, nullptr, false);
  auto mx = b.Reduce(ReduceKind::kMax, x, nullptr, false);
  auto am = b.Reduce(ReduceKind::kArgmax, x, nullptr, false);
  auto mean = b.Reduce(ReduceKind::kMean, x, nullptr, false);
  auto ps = b.Psum(x, "i");
  auto pm = b.Pcollective(OpKind::kPmax, x, "i");
  auto pn = b.Pcollective(OpKind::kPmin, x, "i");
  auto ag = b.AllGather(x, "i", 0);
  auto tk = b.TopK(x, 2);
  ASSERT_TRUE(sum.ok() && mx.ok() && am.ok() && mean.ok() && ps.ok() && pm.ok() && pn.ok() &&
              ag.ok() && tk.ok());
  auto rows = b.Constant(DType::kI32, {2}, Bytes<int32_t>({1, 0}));
  ASSERT_TRUE(rows.ok());
  auto taken = b.Take(x, *rows, 0);
  auto tr = b.Transpose(x, {1, 0});
  auto mm = b.Matmul(x, *tr);
  ASSERT_TRUE(taken.ok() && tr.ok() && mm.ok());
  auto exe = MustCompile(b.Build({*sum, *mx, *am, *mean, *ps, *pm, *pn, *ag, *tk, *taken, *mm}));
  ASSERT_NE(exe, nullptr);
  const std::vector<uint32_t> xs = {4294967295u, 2, 3, 1, 2147483648u, 0,   // shard 0
                                    5, 4294967294u, 7, 8, 9, 10};           // shard 1
  const auto out = RunGang(*exe, 2, {Bytes(xs)});
  EXPECT_EQ(Values<uint32_t>(out[0]), (std::vector<uint32_t>{2147483653u, 37u}));
  EXPECT_EQ(Values<uint32_t>(out[1]), (std::vector<uint32_t>{4294967295u, 4294967294u}));
  EXPECT_EQ(Values<int32_t>(out[2]), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Values<double>(out[3])[0], (4294967295.0 + 2 + 3 + 1 + 2147483648.0) / 6);
  std::vector<uint32_t> sums, maxes, mins;
  for (int j = 0; j < 6; ++j) {
    sums.push_back(xs[j] + xs[6 + j]);
    maxes.push_back(std::max(xs[j], xs[6 + j]));
    mins.push_back(std::min(xs[j], xs[6 + j]));
  }
  for (int s = 0; s < 2; ++s) {
    const auto shard = [&](const std::vector<uint8_t>& o) {
      const auto v = Values<uint32_t>(o);
      return std::vector<uint32_t>(v.begin() + s * 6, v.begin() + s * 6 + 6);
    };
    EXPECT_EQ(shard(out[4]), sums);
    EXPECT_EQ(shard(out[5]), maxes);
    EXPECT_EQ(shard(out[6]), mins);
  }
  EXPECT_EQ(Values<uint32_t>(out[7]),
            (std::vector<uint32_t>{4294967295u, 2, 3, 1, 2147483648u, 0, 5, 4294967294u, 7, 8, 9,
                                   10, 4294967295u, 2, 3, 1, 2147483648u, 0, 5, 4294967294u, 7, 8,
                                   9, 10}));
  EXPECT_EQ(Values<int32_t>(out[8]), (std::vector<int32_t>{0, 2, 1, 0, 1, 2, 2, 1}));
  EXPECT_EQ(Values<uint32_t>(out[9]),
            (std::vector<uint32_t>{1, 2147483648u, 0, 4294967295u, 2, 3, 8, 9, 10, 5,
                                   4294967294u, 7}));
  // x @ x.T modulo 2^32, shard 0: rows r0 = (-1, 2, 3), r1 = (1, 2^31, 0) as residues.
  const auto got_mm = Values<uint32_t>(out[10]);
  EXPECT_EQ(got_mm[0], 1u + 4 + 9);
  EXPECT_EQ(got_mm[1], 4294967295u + 0u);  // -1 + 2 * 2^31 = -1 mod 2^32
  EXPECT_EQ(got_mm[3], 1u);                // 1 + 2^62 mod 2^32
}

// --- bfloat16: the convert kernel, and float32 compute rounded once -------------

std::vector<BFloat16> ToBFloat16(const std::vector<float>& fs) {
  std::vector<BFloat16> out;
  for (float f : fs) out.push_back(FloatToBFloat16(f));
  return out;
}

// Converts between bfloat16 and every dtype give ml_dtypes' bits (through
// float32, rounding to nearest even), and casts out of bfloat16 the kernels'
// rules for float32.
TEST(FunctionExecutableBFloat16Test, ConvertsToAndFromEveryDType) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> fv = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f, -nan, 3.4e38f,
                                 0x1p-133f, -2.75f, 1e10f};
  const std::vector<double> dv = {1 + 0x1p-8 + 0x1p-30, 0.1, -inf, 257.0, 1e300, -1e-300, 2.5, 0};
  const std::vector<int32_t> iv = {16777217, 257, -259, 0, 7, std::numeric_limits<int32_t>::min(),
                                   3, -1};
  const std::vector<uint32_t> uv = {4294967295u, 1, 2, 3, 255, 256, 257, 258};
  const std::vector<uint8_t> pv = {1, 0, 1, 1, 0, 0, 1, 0};
  FunctionBuilder b("f", "");
  const int32_t f = b.Parameter(DType::kF32, {8});
  const int32_t d = b.Parameter(DType::kF64, {8});
  const int32_t i = b.Parameter(DType::kI32, {8});
  const int32_t u = b.Parameter(DType::kU32, {8});
  const int32_t p = b.Parameter(DType::kBool, {8});
  std::vector<int32_t> outs;
  for (int32_t x : {f, d, i, u, p}) outs.push_back(*b.Convert(x, DType::kBF16));
  const int32_t h = outs[0];
  for (DType to : {DType::kF32, DType::kF64, DType::kI32, DType::kU32, DType::kBool}) {
    outs.push_back(*b.Convert(h, to));
  }
  auto exe = MustCompile(b.Build(outs));
  ASSERT_NE(exe, nullptr);
  for (int shards : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    auto repeat = [&](auto v) {
      decltype(v) all;
      for (int s = 0; s < shards; ++s) all.insert(all.end(), v.begin(), v.end());
      return Bytes(all);
    };
    const auto out =
        RunGang(*exe, shards, {repeat(fv), repeat(dv), repeat(iv), repeat(uv), repeat(pv)});
    const std::vector<BFloat16> got_f = Values<BFloat16>(out[0]);
    const std::vector<BFloat16> got_d = Values<BFloat16>(out[1]);
    const std::vector<BFloat16> got_i = Values<BFloat16>(out[2]);
    const std::vector<BFloat16> got_u = Values<BFloat16>(out[3]);
    const std::vector<BFloat16> got_p = Values<BFloat16>(out[4]);
    for (int s = 0; s < shards; ++s) {
      for (int j = 0; j < 8; ++j) {
        SCOPED_TRACE(testing::Message() << "element " << j);
        const int e = s * 8 + j;
        EXPECT_EQ(got_f[e], FloatToBFloat16(fv[j]));
        EXPECT_EQ(got_d[e], FloatToBFloat16(static_cast<float>(dv[j])));  // twice rounded
        EXPECT_EQ(got_i[e], FloatToBFloat16(static_cast<float>(iv[j])));
        EXPECT_EQ(got_u[e], FloatToBFloat16(static_cast<float>(uv[j])));
        EXPECT_EQ(got_p[e].bits, pv[j] ? 0x3f80 : 0x0000);
      }
    }
    // Spot values: ties to even, NaN quiet with its sign, overflow to inf,
    // the smallest subnormal kept, 2^24 + 1 through float32.
    EXPECT_EQ(got_f[0].bits, 0x3f80);
    EXPECT_EQ(got_f[1].bits, 0x3f82);
    EXPECT_EQ(got_f[2].bits, 0x8000);
    EXPECT_EQ(got_f[3].bits, 0xffc0);
    EXPECT_EQ(got_f[4].bits, 0x7f80);
    EXPECT_EQ(got_f[5].bits, 0x0001);
    EXPECT_EQ(got_d[0].bits, 0x3f80);  // 1 + 2^-8 + 2^-30 is a float32 tie first
    EXPECT_EQ(got_i[0].bits, 0x4b80);
    const std::vector<float> back = Values<float>(out[5]);
    const std::vector<double> back64 = Values<double>(out[6]);
    const std::vector<int32_t> ints = Values<int32_t>(out[7]);
    const std::vector<uint32_t> uints = Values<uint32_t>(out[8]);
    const std::vector<uint8_t> bools = out[9];
    for (int j = 0; j < 8; ++j) {
      const float w = BFloat16ToFloat(got_f[j]);
      EXPECT_EQ(std::bit_cast<uint32_t>(back[j]), std::bit_cast<uint32_t>(w)) << j;
      if (!std::isnan(w)) EXPECT_EQ(back64[j], static_cast<double>(w)) << j;
    }
    EXPECT_TRUE(std::isnan(back64[3]));
    const int32_t m = std::numeric_limits<int32_t>::min();
    EXPECT_EQ(std::vector<int32_t>(ints.begin(), ints.begin() + 8),
              (std::vector<int32_t>{1, 1, 0, m, m, 0, -2, m}));
    EXPECT_EQ(uints[0], 1u);
    EXPECT_EQ(uints[3], 0u);           // NaN
    EXPECT_EQ(uints[4], 4294967295u);  // inf saturates
    EXPECT_EQ(uints[6], 0u);           // negative saturates
    EXPECT_EQ(uints[5], 0u);           // 2^-133 truncates
    EXPECT_EQ(uints[7], 4294967295u);  // 1e10 saturates
    EXPECT_EQ(std::vector<uint8_t>(bools.begin(), bools.begin() + 8),
              (std::vector<uint8_t>{1, 1, 0, 1, 1, 1, 1, 1}));  // -0 is false, NaN true
  }
}

// Every op on bfloat16 gives the float32 result of its bfloat16 inputs,
// rounded once to bfloat16; sums and products accumulate in float32.
TEST(FunctionExecutableBFloat16Test, ComputesInFloat32AndRoundsOnce) {
  const std::vector<BFloat16> av =
      ToBFloat16({1.0f, 3.140625f, -2.5f, 1e-3f, 300.0f, -0.0f, 0.1f, 7.0f});
  const std::vector<BFloat16> bv = ToBFloat16({3.0f, 0.3f, 1.75f, -7.0f, 0.01f, 2.0f, 0.1f, -0.5f});
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kBF16, {8});
  const int32_t y = b.Parameter(DType::kBF16, {8});
  const OpKind binary[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv,
                           OpKind::kPow, OpKind::kMax, OpKind::kMin};
  const OpKind unary[] = {OpKind::kExp, OpKind::kTanh, OpKind::kSin, OpKind::kNeg, OpKind::kAbs};
  std::vector<int32_t> outs;
  for (OpKind k : binary) outs.push_back(*b.Binary(k, x, y));
  for (OpKind k : unary) outs.push_back(*b.Unary(k, x));
  outs.push_back(*b.Binary(OpKind::kGe, x, y));
  // 256 + 1 + 1 + 1 + 1 in bfloat16 steps would stay 256 (its spacing there
  // is 2); accumulated in float32 it is 260, which bfloat16 holds.
  const int32_t v = *b.Constant(DType::kBF16, {5}, Bytes(ToBFloat16({256, 1, 1, 1, 1})));
  const int32_t ones = *b.Constant(DType::kBF16, {5, 1}, Bytes(ToBFloat16({1, 1, 1, 1, 1})));
  outs.push_back(*b.Reduce(ReduceKind::kSum, v, nullptr, false));
  outs.push_back(*b.Matmul(*b.Reshape(v, {1, 5}), ones));
  outs.push_back(*b.Reduce(ReduceKind::kMean, v, nullptr, false));  // 52
  outs.push_back(*b.Reduce(ReduceKind::kMax, x, nullptr, false));
  outs.push_back(*b.Reduce(ReduceKind::kArgmax, x, nullptr, false));
  auto exe = MustCompile(b.Build(outs));
  ASSERT_NE(exe, nullptr);
  EXPECT_GE(exe->fusion_groups().size(), 1u);  // the converts fuse with the ops around them
  auto twice = [](const std::vector<BFloat16>& h) {
    std::vector<BFloat16> all = h;
    all.insert(all.end(), h.begin(), h.end());
    return Bytes(all);
  };
  const auto out = RunGang(*exe, 2, {twice(av), twice(bv)});
  std::vector<float> fa, fb;
  for (int j = 0; j < 8; ++j) {
    fa.push_back(BFloat16ToFloat(av[j]));
    fb.push_back(BFloat16ToFloat(bv[j]));
  }
  auto reference = [&](OpKind kind, float p, float q) -> float {
    switch (kind) {
      case OpKind::kAdd: return p + q;
      case OpKind::kSub: return p - q;
      case OpKind::kMul: return p * q;
      case OpKind::kDiv: return p / q;
      case OpKind::kPow: return std::pow(p, q);
      case OpKind::kMax: return std::max(p, q);
      default: return std::min(p, q);
    }
  };
  size_t o = 0;
  for (OpKind kind : binary) {
    SCOPED_TRACE(OpKindName(kind));
    const std::vector<BFloat16> got = Values<BFloat16>(out[o++]);
    ASSERT_EQ(got.size(), 16u);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(got[j], FloatToBFloat16(reference(kind, fa[j % 8], fb[j % 8]))) << j;
    }
  }
  std::vector<float> fexp(8), ftanh(8), fsin(8);
  Exp(fa.data(), fexp.data(), 8);
  Tanh(fa.data(), ftanh.data(), 8);
  Sin(fa.data(), fsin.data(), 8);
  for (const std::vector<float>* want : {&fexp, &ftanh, &fsin}) {
    const std::vector<BFloat16> got = Values<BFloat16>(out[o++]);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(got[j], FloatToBFloat16((*want)[j % 8])) << j;
  }
  const std::vector<BFloat16> neg = Values<BFloat16>(out[o++]);
  const std::vector<BFloat16> abs = Values<BFloat16>(out[o++]);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(neg[j].bits, av[j % 8].bits ^ 0x8000);  // -(-0.0) is +0.0
    EXPECT_EQ(abs[j].bits, av[j % 8].bits & 0x7fff);
  }
  const std::vector<uint8_t> ge = out[o++];
  for (int j = 0; j < 16; ++j) EXPECT_EQ(ge[j], fa[j % 8] >= fb[j % 8] ? 1 : 0) << j;
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(Values<BFloat16>(out[o])[s].bits, FloatToBFloat16(260.0f).bits);
    EXPECT_EQ(Values<BFloat16>(out[o + 1])[s].bits, FloatToBFloat16(260.0f).bits);
    EXPECT_EQ(Values<BFloat16>(out[o + 2])[s].bits, FloatToBFloat16(52.0f).bits);
    EXPECT_EQ(Values<BFloat16>(out[o + 3])[s].bits, FloatToBFloat16(300.0f).bits);
    EXPECT_EQ(Values<int32_t>(out[o + 4])[s], 4);
  }
}

// The kernels that move elements take bfloat16 as it is: select, take,
// concatenate, pad, transpose, and simulated compute.
TEST(FunctionExecutableBFloat16Test, MovesBFloat16AsItIs) {
  const std::vector<BFloat16> hv = ToBFloat16({1.5f, -0.0f, 0x1p-133f, -3.0f, 65280.0f, 0.1f});
  FunctionBuilder b("f", "");
  const int32_t h = b.Parameter(DType::kBF16, {2, 3});
  const int32_t p = b.Parameter(DType::kBool, {3});
  const int32_t two = *b.Constant(DType::kI32, {}, Bytes(std::vector<int32_t>{2}));
  const int32_t idx = *b.Constant(DType::kI32, {2}, Bytes(std::vector<int32_t>{1, 0}));
  std::vector<int32_t> outs;
  outs.push_back(*b.Select(p, h, two));  // 2 as bfloat16 where p is false
  outs.push_back(*b.Take(h, idx, 0));
  outs.push_back(*b.Concatenate(std::vector<int32_t>{h, h}, 1));
  outs.push_back(*b.Pad(h, {0, 1}, {0, 0}, {0, 1}));
  outs.push_back(*b.Transpose(h, {1, 0}));
  outs.push_back(*b.SimulatedCompute(h, 0));
  auto exe = MustCompile(b.Build(outs));
  ASSERT_NE(exe, nullptr);
  const auto out = RunGang(*exe, 1, {Bytes(hv), Bytes(std::vector<uint8_t>{1, 0, 1})});
  auto bits = [&](int i) {
    std::vector<uint16_t> v;
    for (BFloat16 x : Values<BFloat16>(out[i])) v.push_back(x.bits);
    return v;
  };
  const std::vector<uint16_t> in = {hv[0].bits, hv[1].bits, hv[2].bits,
                                    hv[3].bits, hv[4].bits, hv[5].bits};
  EXPECT_EQ(bits(0), (std::vector<uint16_t>{in[0], 0x4000, in[2], in[3], 0x4000, in[5]}));
  EXPECT_EQ(bits(1), (std::vector<uint16_t>{in[3], in[4], in[5], in[0], in[1], in[2]}));
  EXPECT_EQ(bits(2), (std::vector<uint16_t>{in[0], in[1], in[2], in[0], in[1], in[2],
                                            in[3], in[4], in[5], in[3], in[4], in[5]}));
  EXPECT_EQ(bits(3), (std::vector<uint16_t>{0, in[0], 0, in[1], 0, in[2],
                                            0, in[3], 0, in[4], 0, in[5]}));
  EXPECT_EQ(bits(4), (std::vector<uint16_t>{in[0], in[3], in[1], in[4], in[2], in[5]}));
  EXPECT_EQ(bits(5), in);
}

TEST(FunctionExecutableElementwiseTest, UnaryMathLogicAndConverts) {
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {3});
  const int32_t p = b.Parameter(DType::kBool, {3});
  auto ex = b.Unary(OpKind::kExp, x);
  auto rs = b.Unary(OpKind::kRsqrt, x);
  auto cs = b.Unary(OpKind::kCos, x);
  auto np = b.Unary(OpKind::kNot, p);
  auto gt = b.Binary(OpKind::kGt, x, p);  // compares in f32
  auto xo = b.Binary(OpKind::kXor, p, *gt);
  auto toi = b.Convert(x, DType::kI32);
  auto tob = b.Convert(x, DType::kBool);
  auto mn = b.Binary(OpKind::kMin, x, *toi);  // f64
  ASSERT_TRUE(ex.ok() && rs.ok() && cs.ok() && np.ok() && gt.ok() && xo.ok() && toi.ok() &&
              tob.ok() && mn.ok());
  auto exe = MustCompile(b.Build({*ex, *rs, *cs, *np, *xo, *toi, *tob, *mn}));
  ASSERT_NE(exe, nullptr);
  const std::vector<float> xv = {0.25f, 4.0f, -2.5f};
  const std::vector<uint8_t> pv = {1, 0, 1};
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    std::vector<float> xs;
    std::vector<uint8_t> ps;
    for (int s = 0; s < shards; ++s) {
      xs.insert(xs.end(), xv.begin(), xv.end());
      ps.insert(ps.end(), pv.begin(), pv.end());
    }
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs), ps}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto e = Values<float>(out[0]);
    const auto r = Values<float>(out[1]);
    const auto c = Values<float>(out[2]);
    const auto& n = out[3];
    const auto& xo_v = out[4];
    const auto ti = Values<int32_t>(out[5]);
    const auto& tb = out[6];
    const auto m = Values<double>(out[7]);
    for (int s = 0; s < shards; ++s) {
      for (int j = 0; j < 3; ++j) {
        const int i = 3 * s + j;
        EXPECT_FLOAT_EQ(e[i], std::exp(xv[j]));
        if (xv[j] > 0) {
          EXPECT_FLOAT_EQ(r[i], 1.0f / std::sqrt(xv[j]));
        }
        EXPECT_FLOAT_EQ(c[i], std::cos(xv[j]));
        EXPECT_EQ(n[i], pv[j] ? 0 : 1);
        EXPECT_EQ(xo_v[i], (pv[j] != 0) != (xv[j] > static_cast<float>(pv[j])) ? 1 : 0);
        EXPECT_EQ(ti[i], static_cast<int32_t>(xv[j]));  // truncates toward zero
        EXPECT_EQ(tb[i], 1);
        EXPECT_EQ(m[i], std::min<double>(xv[j], static_cast<int32_t>(xv[j])));
      }
    }
  }
}


// Reference reduction of one shard's [2,3,4] value over `axes`.
template <typename T, typename F>
std::vector<T> RefReduce(const T* x, const std::vector<bool>& red, T init, F f) {
  const int64_t dims[3] = {2, 3, 4};
  int64_t out_n = 1;
  for (int d = 0; d < 3; ++d) out_n *= red[d] ? 1 : dims[d];
  std::vector<T> out(out_n, init);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 4; ++c) {
        int64_t o = 0;
        const int64_t idx[3] = {a, b, c};
        for (int d = 0; d < 3; ++d) {
          if (!red[d]) o = o * dims[d] + idx[d];
        }
        out[o] = f(out[o], x[(a * 3 + b) * 4 + c]);
      }
  return out;
}

TYPED_TEST(FunctionExecutableTest, ReduceOverAxes) {
  using T = TypeParam;
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DTypeOf<T>(), {2, 3, 4});
  const std::vector<int64_t> a1 = {1};
  const std::vector<int64_t> a02 = {0, -1};
  auto s1 = b.Reduce(ReduceKind::kSum, x, &a1, false);
  auto m02 = b.Reduce(ReduceKind::kMean, x, &a02, true);
  auto mx = b.Reduce(ReduceKind::kMax, x, nullptr, false);
  auto mn = b.Reduce(ReduceKind::kMin, x, &a1, true);
  auto am = b.Reduce(ReduceKind::kArgmax, x, &a1, false);
  ASSERT_TRUE(s1.ok() && m02.ok() && mx.ok() && mn.ok() && am.ok());
  EXPECT_EQ(b.type(*s1).ToString(), TypeToString(DTypeOf<T>(), {2, 4}));
  EXPECT_EQ(b.type(*m02).ToString(), TypeToString(DTypeOf<T>(), {1, 3, 1}));
  EXPECT_EQ(b.type(*am).ToString(), "i32[2,4]");
  auto exe = MustCompile(b.Build({*s1, *m02, *mx, *mn, *am}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    // Values that are not monotone in the index, so argmax is not trivial.
    std::vector<T> xs(shards * 24);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = T(((i * 7) % 11)) - T(4.5);
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto got_s = Values<T>(out[0]);
    const auto got_m = Values<T>(out[1]);
    const auto got_x = Values<T>(out[2]);
    const auto got_n = Values<T>(out[3]);
    const auto got_a = Values<int32_t>(out[4]);
    for (int sh = 0; sh < shards; ++sh) {
      const T* p = xs.data() + sh * 24;
      auto add = [](T a, T v) { return a + v; };
      const auto e_s = RefReduce<T>(p, {false, true, false}, T(0), add);
      auto e_m = RefReduce<T>(p, {true, false, true}, T(0), add);
      for (T& v : e_m) v /= T(8);
      const auto e_x = RefReduce<T>(p, {true, true, true}, T(-1e9),
                                    [](T a, T v) { return std::max(a, v); });
      const auto e_n = RefReduce<T>(p, {false, true, false}, T(1e9),
                                    [](T a, T v) { return std::min(a, v); });
      for (int j = 0; j < 8; ++j) EXPECT_NEAR(got_s[sh * 8 + j], e_s[j], 1e-5);
      for (int j = 0; j < 3; ++j) EXPECT_NEAR(got_m[sh * 3 + j], e_m[j], 1e-5);
      EXPECT_EQ(got_x[sh], e_x[0]);
      for (int j = 0; j < 8; ++j) EXPECT_EQ(got_n[sh * 8 + j], e_n[j]);
      for (int a = 0; a < 2; ++a) {
        for (int c = 0; c < 4; ++c) {
          int best = 0;
          for (int r = 1; r < 3; ++r) {
            if (p[(a * 3 + r) * 4 + c] > p[(a * 3 + best) * 4 + c]) best = r;
          }
          EXPECT_EQ(got_a[sh * 8 + a * 4 + c], best) << "a=" << a << " c=" << c;
        }
      }
    }
  }
}

TYPED_TEST(FunctionExecutableTest, CollectivesOverShards) {
  using T = TypeParam;
  constexpr int64_t n = 3;
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    FunctionBuilder b("f", "i");
    ASSERT_TRUE(b.SetAxisSize(shards).ok());
    const int32_t x = b.Parameter(DTypeOf<T>(), {n});
    auto mean = b.Pcollective(OpKind::kPmean, x, "i");
    auto mx = b.Pcollective(OpKind::kPmax, x, "i");
    auto mn = b.Pcollective(OpKind::kPmin, x, "i");
    auto idx = b.AxisIndex("i");
    auto g0 = b.AllGather(x, "i", 0);
    auto g1 = b.AllGather(x, "i", -1);
    std::vector<std::pair<int64_t, int64_t>> perm;
    for (int s = 0; s + 1 < shards; ++s) perm.push_back({s, s + 1});  // shift right
    auto pp = b.Ppermute(x, "i", perm);
    ASSERT_TRUE(mean.ok() && mx.ok() && mn.ok() && idx.ok() && g0.ok() && g1.ok() && pp.ok());
    EXPECT_EQ(b.type(*g1).ToString(), TypeToString(DTypeOf<T>(), {n, shards}));
    auto exe = MustCompile(b.Build({*mean, *mx, *mn, *idx, *g0, *g1, *pp}));
    ASSERT_NE(exe, nullptr);
    EXPECT_TRUE(exe->ir().has_collectives());
    std::vector<T> xs(shards * n);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = T(((i * 5) % 7)) - T(2.25);
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto got_mean = Values<T>(out[0]);
    const auto got_max = Values<T>(out[1]);
    const auto got_min = Values<T>(out[2]);
    const auto got_idx = Values<int32_t>(out[3]);
    const auto got_g0 = Values<T>(out[4]);
    const auto got_g1 = Values<T>(out[5]);
    const auto got_pp = Values<T>(out[6]);
    for (int sh = 0; sh < shards; ++sh) {
      EXPECT_EQ(got_idx[sh], sh);
      for (int64_t j = 0; j < n; ++j) {
        T sum = 0, hi = xs[j], lo = xs[j];
        for (int t = 0; t < shards; ++t) {
          const T v = xs[t * n + j];
          sum += v;
          hi = std::max(hi, v);
          lo = std::min(lo, v);
          EXPECT_EQ(got_g0[sh * shards * n + t * n + j], v);
          EXPECT_EQ(got_g1[sh * shards * n + j * shards + t], v);
        }
        EXPECT_NEAR(got_mean[sh * n + j], sum / T(shards), 1e-5);
        EXPECT_EQ(got_max[sh * n + j], hi);
        EXPECT_EQ(got_min[sh * n + j], lo);
        EXPECT_EQ(got_pp[sh * n + j], sh == 0 ? T(0) : xs[(sh - 1) * n + j]);
      }
    }
  }
}

TEST(FunctionExecutableReduceTest, IntAndBoolReductions) {
  FunctionBuilder b("f", "i");
  const int32_t x = b.Parameter(DType::kI32, {2, 3});
  const int32_t p = b.Parameter(DType::kBool, {2, 3});
  const std::vector<int64_t> a0 = {0};
  auto sx = b.Reduce(ReduceKind::kSum, x, &a0, false);
  auto mx = b.Reduce(ReduceKind::kMean, x, nullptr, false);
  auto sp = b.Reduce(ReduceKind::kSum, p, nullptr, false);
  auto ap = b.Reduce(ReduceKind::kArgmax, p, nullptr, false);
  auto pm = b.Pcollective(OpKind::kPmean, x, "i");
  ASSERT_TRUE(sx.ok() && mx.ok() && sp.ok() && ap.ok() && pm.ok());
  EXPECT_EQ(b.type(*sx).ToString(), "i32[3]");
  EXPECT_EQ(b.type(*mx).ToString(), "f64[]");
  EXPECT_EQ(b.type(*sp).ToString(), "i32[]");
  EXPECT_EQ(b.type(*ap).ToString(), "i32[]");
  auto exe = MustCompile(b.Build({*sx, *mx, *sp, *ap, *pm}));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    std::vector<int32_t> xs;
    std::vector<uint8_t> ps;
    for (int s = 0; s < shards; ++s) {
      for (int32_t v : {1, -2, 3, 2147483647, 5, s}) xs.push_back(v);
      for (int v : {0, 0, 1, 1, 0, 1}) ps.push_back(static_cast<uint8_t>(v));
    }
    const auto out = RunGang(*exe, shards, {Bytes(xs), ps});
    const auto got_sx = Values<int32_t>(out[0]);
    const auto got_mx = Values<double>(out[1]);
    const auto got_sp = Values<int32_t>(out[2]);
    const auto got_ap = Values<int32_t>(out[3]);
    const auto got_pm = Values<int32_t>(out[4]);
    for (int s = 0; s < shards; ++s) {
      EXPECT_EQ(got_sx[s * 3 + 0], -2147483647 - 1);  // 1 + INT32_MAX wraps, as numpy
      EXPECT_EQ(got_sx[s * 3 + 1], 3);
      EXPECT_EQ(got_sx[s * 3 + 2], 3 + s);
      EXPECT_DOUBLE_EQ(got_mx[s], (1.0 - 2 + 3 + 2147483647.0 + 5 + s) / 6);
      EXPECT_EQ(got_sp[s], 3);
      EXPECT_EQ(got_ap[s], 2);
      // pmean of int32 truncates toward zero: element 5 holds the shard index.
      EXPECT_EQ(got_pm[s * 6 + 5], static_cast<int32_t>((shards - 1) / 2.0));
      EXPECT_EQ(got_pm[s * 6 + 1], -2);
    }
  }
}

// top_k of a parameter (each shard's rows differ and tie) and of a constant
// (the same on every shard), against a stable sort of each row; no
// allocation while it runs.
TEST(FunctionExecutableTopKTest, PositionsOfEachRowOfEachShard) {
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    FunctionBuilder b("f", "i");
    const int32_t x = b.Parameter(DType::kF32, {2, 3, 5});
    auto t = b.TopK(x, 3);
    auto c = b.Constant(DType::kI32, {4}, Bytes<int32_t>({5, 9, 5, -1}));
    ASSERT_TRUE(t.ok() && c.ok());
    auto tc = b.TopK(*c, 2);
    ASSERT_TRUE(tc.ok());
    auto exe = MustCompile(b.Build({*t, *tc}));
    ASSERT_NE(exe, nullptr);
    std::vector<float> xs(shards * 30);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 7 + i / 5) % 4);
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto got = Values<int32_t>(out[0]);
    const auto got_c = Values<int32_t>(out[1]);
    ASSERT_EQ(got.size(), static_cast<size_t>(shards * 18));
    for (int row = 0; row < shards * 6; ++row) {
      std::vector<int32_t> pos = {0, 1, 2, 3, 4};
      const float* r = xs.data() + row * 5;
      std::stable_sort(pos.begin(), pos.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
      EXPECT_EQ(std::vector<int32_t>(got.begin() + row * 3, got.begin() + row * 3 + 3),
                std::vector<int32_t>(pos.begin(), pos.begin() + 3))
          << "row " << row;
    }
    for (int s = 0; s < shards; ++s) {
      EXPECT_EQ(got_c[s * 2], 1);
      EXPECT_EQ(got_c[s * 2 + 1], 0);
    }
  }
}

// sort, cumulative and scatter through the interpreter, each shard's rows
// its own: sort of a parameter (ties, both directions), cumsum along a
// middle axis and a reversed cummax, a scatter (set, with an out-of-range
// and a duplicate index) into a parameter and a scatter (add) into a zero
// scalar; erf of a parameter. No allocation while it runs.
// Each shard's matrices decompose as the kernel decomposes them alone, into
// the tuple's pieces; nothing is allocated.
TEST(FunctionExecutableTest, SvdPerShardIntoItsTuple) {
  for (int shards : kShardCounts) {
    for (bool full : {false, true}) {
      SCOPED_TRACE(testing::Message() << "shards=" << shards << " full=" << full);
      FunctionBuilder b("f", "");
      const int32_t x = b.Parameter(DType::kF64, {2, 4, 3});
      auto results = b.SvdResults(x, full);
      ASSERT_TRUE(results.ok()) << results.status();
      // Something after it that reads an element, so slots are reused.
      auto twice = b.Binary(OpKind::kMul, (*results)[1], (*results)[1]);
      ASSERT_TRUE(twice.ok());
      auto exe = MustCompile(b.Build({(*results)[0], (*results)[1], (*results)[2], *twice}));
      ASSERT_NE(exe, nullptr);
      std::vector<double> xs(shards * 24);
      for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7 * static_cast<double>(i * i + 1));
      int64_t allocations = -1;
      const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
      EXPECT_EQ(allocations, 0);
      const int64_t uc = full ? 4 : 3;
      std::vector<double> u(shards * 2 * 4 * uc), sv(shards * 2 * 3), vt(shards * 2 * 3 * 3);
      const int64_t bytes = kernels::SvdWorkspaceBytes(DType::kF64, 4, 3, full);
      std::vector<Block> workspace(static_cast<size_t>(bytes / 64 + 1));
      kernels::SvdMatrices(DType::kF64, shards * 2, 4, 3, full, xs.data(), u.data(), sv.data(),
                           vt.data(), workspace.data(), bytes);
      EXPECT_EQ(Values<double>(out[0]), u);
      EXPECT_EQ(Values<double>(out[1]), sv);
      EXPECT_EQ(Values<double>(out[2]), vt);
      const auto sq = Values<double>(out[3]);
      for (size_t i = 0; i < sv.size(); ++i) EXPECT_EQ(sq[i], sv[i] * sv[i]);
      // Singular values of the matrices are those of x^T x's square roots:
      // their squares sum to the squared Frobenius norm.
      for (int64_t mtx = 0; mtx < shards * 2; ++mtx) {
        double fro = 0;
        for (int64_t i = 0; i < 12; ++i) fro += xs[mtx * 12 + i] * xs[mtx * 12 + i];
        EXPECT_NEAR(sq[mtx * 3] + sq[mtx * 3 + 1] + sq[mtx * 3 + 2], fro, 1e-12);
      }
    }
  }
}

TEST(FunctionExecutableTest, SortCumulativeScatterAndErfPerShard) {
  for (int shards : kShardCounts) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    FunctionBuilder b("f", "i");
    const int32_t x = b.Parameter(DType::kF32, {2, 3, 4});
    auto up = b.Sort(x, false);
    auto down = b.Sort(x, true);
    auto csum = b.Cumulative(Combiner::kAdd, x, 1, false);
    auto cmax = b.Cumulative(Combiner::kMax, x, -1, true);
    auto idx = b.Constant(DType::kI32, {3}, Bytes<int32_t>({3, 7, 3}));  // 7: dropped
    ASSERT_TRUE(idx.ok());
    auto upd = b.Constant(DType::kF32, {2, 3, 3},
                          Bytes<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                        18}));
    ASSERT_TRUE(upd.ok());
    auto set = b.Scatter(Combiner::kSet, x, *idx, *upd, 2, 4);
    auto add = b.ScatterAdd(*upd, *idx, 2, 4);
    auto erf = b.Unary(OpKind::kErf, x);
    ASSERT_TRUE(up.ok() && down.ok() && csum.ok() && cmax.ok() && set.ok() && add.ok() && erf.ok());
    auto exe = MustCompile(b.Build({*up, *down, *csum, *cmax, *set, *add, *erf}));
    ASSERT_NE(exe, nullptr);
    std::vector<float> xs(shards * 24);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 5 + i / 7) % 6) - 2.5f;
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto got_up = Values<int32_t>(out[0]);
    const auto got_down = Values<int32_t>(out[1]);
    const auto got_csum = Values<float>(out[2]);
    const auto got_cmax = Values<float>(out[3]);
    const auto got_set = Values<float>(out[4]);
    const auto got_add = Values<float>(out[5]);
    const auto got_erf = Values<float>(out[6]);
    for (int s = 0; s < shards; ++s) {
      for (int a = 0; a < 2; ++a) {
        for (int r = 0; r < 3; ++r) {
          const int row = (s * 2 + a) * 3 + r;
          const float* v = xs.data() + row * 4;
          std::vector<int32_t> asc = {0, 1, 2, 3};
          std::stable_sort(asc.begin(), asc.end(), [&](int32_t i, int32_t j) { return v[i] < v[j]; });
          std::vector<int32_t> desc = {0, 1, 2, 3};
          std::stable_sort(desc.begin(), desc.end(), [&](int32_t i, int32_t j) { return v[i] > v[j]; });
          EXPECT_EQ(std::vector<int32_t>(got_up.begin() + row * 4, got_up.begin() + row * 4 + 4), asc);
          EXPECT_EQ(std::vector<int32_t>(got_down.begin() + row * 4, got_down.begin() + row * 4 + 4),
                    desc);
          float running = -INFINITY;
          for (int c = 3; c >= 0; --c) {
            running = std::max(running, v[c]);
            EXPECT_EQ(got_cmax[row * 4 + c], running);
          }
          for (int c = 0; c < 4; ++c) {
            float sum = 0;
            for (int q = 0; q <= r; ++q) sum += xs[((s * 2 + a) * 3 + q) * 4 + c];
            EXPECT_EQ(got_csum[row * 4 + c], sum);
            EXPECT_EQ(got_erf[row * 4 + c], static_cast<float>(std::erf(double{v[c]})));
            // Updates row (a, r) is {u0, u1, u2} at indices {3, 7, 3}: the
            // last at 3 wins for set, both at 3 add; 7 is dropped.
            const float* u = nullptr;
            const float us[18] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
            u = us + (a * 3 + r) * 3;
            EXPECT_EQ(got_set[row * 4 + c], c == 3 ? u[2] : v[c]);
            EXPECT_EQ(got_add[row * 4 + c], c == 3 ? u[0] + u[2] : 0.f);
          }
        }
      }
    }
  }
}

// Shape ops, gathers, matmul and the all_to_all / psum_scatter collectives
// on x = f32[2,3] per shard (x[s][i][j] = 100 s + 10 i + j), against index
// arithmetic written out here.
TEST(FunctionExecutableDataMovementTest, ShapeOpsGathersMatmulAndCollectives) {
  for (int shards : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    FunctionBuilder b("f", "i");
    ASSERT_TRUE(b.SetAxisSize(shards).ok());
    const int32_t x = b.Parameter(DType::kF32, {2, 3});
    auto xt = b.Transpose(x, {1, 0});
    auto sl = b.Slice(x, {0, 1}, {2, 3}, {1, 1});
    auto rv = b.Rev(x, {-1});
    auto pd = b.Pad(x, {1, 0}, {0, 1}, {0, 1});
    auto cc = b.Concatenate(std::vector<int32_t>{x, x}, 1);
    auto idx = b.Constant(DType::kI32, {2}, Bytes<int32_t>({2, 0}));
    ASSERT_TRUE(idx.ok());
    auto tk = b.Take(x, *idx, 1);
    auto rep = b.Constant(DType::kI32, {2}, Bytes<int32_t>({1, 1}));
    ASSERT_TRUE(rep.ok());
    ASSERT_TRUE(tk.ok() && xt.ok());
    auto sa = b.ScatterAdd(*tk, *rep, 1, 3);
    auto mm = b.Matmul(x, *xt);
    auto bc = b.BroadcastTo(*sl, {2, 2, 2});
    auto rs = b.Reshape(x, {3, 2});
    auto a2a = b.AllToAll(x, "i", 1, 0);
    ASSERT_TRUE(sl.ok() && rv.ok() && pd.ok() && cc.ok() && sa.ok() && mm.ok() && bc.ok() &&
                rs.ok() && a2a.ok())
        << sl.status() << rv.status() << pd.status() << cc.status() << sa.status()
        << mm.status() << bc.status() << rs.status() << a2a.status();
    absl::StatusOr<int32_t> ps = absl::InvalidArgumentError("unused");
    if (shards == 3) ps = b.PsumScatter(x, "i", 1);
    std::vector<int32_t> outs = {*xt, *sl, *rv, *pd, *cc, *tk, *sa, *mm, *bc, *rs, *a2a};
    if (shards == 3) {
      ASSERT_TRUE(ps.ok()) << ps.status();
      outs.push_back(*ps);
    }
    auto exe = MustCompile(b.Build(outs));
    ASSERT_NE(exe, nullptr);
    std::vector<float> xs;
    for (int s = 0; s < shards; ++s) {
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 3; ++j) xs.push_back(100.f * s + 10.f * i + j);
      }
    }
    auto X = [&](int s, int i, int j) { return xs[s * 6 + i * 3 + j]; };
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(xs)}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto got_t = Values<float>(out[0]);
    const auto got_sl = Values<float>(out[1]);
    const auto got_rv = Values<float>(out[2]);
    const auto got_pd = Values<float>(out[3]);
    const auto got_cc = Values<float>(out[4]);
    const auto got_tk = Values<float>(out[5]);
    const auto got_sa = Values<float>(out[6]);
    const auto got_mm = Values<float>(out[7]);
    const auto got_bc = Values<float>(out[8]);
    const auto got_rs = Values<float>(out[9]);
    const auto got_a2a = Values<float>(out[10]);
    for (int s = 0; s < shards; ++s) {
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 3; ++j) {
          EXPECT_EQ(got_t[s * 6 + j * 2 + i], X(s, i, j));
          EXPECT_EQ(got_rv[s * 6 + i * 3 + j], X(s, i, 2 - j));
          EXPECT_EQ(got_cc[s * 12 + i * 6 + j], X(s, i, j));
          EXPECT_EQ(got_cc[s * 12 + i * 6 + 3 + j], X(s, i, j));
          EXPECT_EQ(got_rs[s * 6 + i * 3 + j], X(s, i, j));  // same row-major elements
          // pad: one row above, one column after, one zero between columns.
          EXPECT_EQ(got_pd[s * 18 + (i + 1) * 6 + 2 * j], X(s, i, j));
        }
        for (int j = 0; j < 2; ++j) {
          EXPECT_EQ(got_sl[s * 4 + i * 2 + j], X(s, i, j + 1));
          EXPECT_EQ(got_tk[s * 4 + i * 2 + j], X(s, i, j == 0 ? 2 : 0));
          for (int k = 0; k < 2; ++k) EXPECT_EQ(got_bc[s * 8 + k * 4 + i * 2 + j], X(s, i, j + 1));
        }
        // scatter_add of take(x, [2, 0]) at [1, 1]: both columns land in column 1.
        EXPECT_EQ(got_sa[s * 6 + i * 3 + 0], 0.f);
        EXPECT_EQ(got_sa[s * 6 + i * 3 + 1], X(s, i, 2) + X(s, i, 0));
        EXPECT_EQ(got_sa[s * 6 + i * 3 + 2], 0.f);
        for (int k = 0; k < 2; ++k) {
          float dot = 0;
          for (int j = 0; j < 3; ++j) dot += X(s, i, j) * X(s, k, j);
          EXPECT_FLOAT_EQ(got_mm[s * 4 + i * 2 + k], dot);
        }
      }
      for (int c = 0; c < 6; ++c) {  // pad's other cells are zeros
        EXPECT_EQ(got_pd[s * 18 + c], 0.f);
        if (c % 2 == 1) EXPECT_EQ(got_pd[s * 18 + 6 + c], 0.f);
      }
    }
    // all_to_all(split 1, concat 0): shard d gets chunk d (columns
    // [d*c, (d+1)*c), c = 3 / shards) of every shard, stacked along rows.
    const int c = 3 / shards;
    for (int d = 0; d < shards; ++d) {
      for (int src = 0; src < shards; ++src) {
        for (int i = 0; i < 2; ++i) {
          for (int j = 0; j < c; ++j) {
            EXPECT_EQ(got_a2a[d * 6 + (src * 2 + i) * c + j], X(src, i, d * c + j));
          }
        }
      }
    }
    if (shards == 3) {
      const auto got_ps = Values<float>(out[11]);
      for (int d = 0; d < 3; ++d) {
        for (int i = 0; i < 2; ++i) {
          EXPECT_EQ(got_ps[d * 2 + i], X(0, i, d) + X(1, i, d) + X(2, i, d));
        }
      }
    }
  }
}

TEST(FunctionBuilderShapeTest, ErrorsNameTheOpAndTypes) {
  FunctionBuilder b("f", "i");
  ASSERT_TRUE(b.SetAxisSize(2).ok());
  const int32_t x = b.Parameter(DType::kF32, {3, 4});
  const int32_t f = b.Parameter(DType::kF32, {2});
  auto msg = [](const auto& s) { return std::string(s.status().message()); };
  EXPECT_EQ(msg(b.Reshape(x, {5})), "reshape: cannot reshape f32[3,4] (12 elements) to shape (5)");
  EXPECT_EQ(msg(b.BroadcastTo(x, {4, 4})), "broadcast_to: cannot broadcast f32[3,4] to shape (4, 4)");
  EXPECT_EQ(msg(b.Transpose(x, {1})), "transpose: axes (1) are not a permutation of the 2 dimensions of f32[3,4]");
  EXPECT_EQ(msg(b.Slice(x, {0, 0}, {4, 4}, {1, 1})), "slice: [0:4:1] is not a valid slice of dimension 0 of f32[3,4]");
  EXPECT_EQ(msg(b.Pad(x, {0, -1}, {0, 0}, {0, 0})), "pad: negative padding (-1, 0, interior 0) for dimension 1 of f32[3,4]");
  EXPECT_EQ(msg(b.Concatenate(std::vector<int32_t>{x, f}, 0)), "concatenate: f32[3,4] and f32[2] do not match off axis 0");
  EXPECT_EQ(msg(b.Take(x, f, 0)), "take: indices must be int32, got f32[2]");
  EXPECT_EQ(msg(b.Matmul(x, x)), "matmul: incompatible shapes f32[3,4] and f32[3,4]");
  EXPECT_EQ(msg(b.Matmul(x, f)), "matmul: operands need rank >= 2, got f32[3,4] and f32[2]");
  EXPECT_EQ(msg(b.AllToAll(x, "i", 0, 1)), "all_to_all: split axis 0 of f32[3,4] does not divide into 2 shards");
  EXPECT_EQ(msg(b.AllToAll(x, "j", 1, 0)), "all_to_all: unbound axis name 'j' (bound: 'i')");
  EXPECT_EQ(msg(b.PsumScatter(x, "i", 1)), "psum_scatter: dimension 1 of f32[3,4] must equal the number of shards, 2");
  EXPECT_EQ(msg(b.Rev(x, {2})), "rev: axis 2 is out of range for f32[3,4]");
  // No-ops return the operand itself.
  EXPECT_EQ(*b.Reshape(x, {3, 4}), x);
  EXPECT_EQ(*b.Transpose(x, {0, 1}), x);
  EXPECT_EQ(*b.Slice(x, {0, 0}, {3, 4}, {1, 1}), x);
  EXPECT_NE(*b.Copy(x), x);
}

// A fused elementwise run over several tiles whose boundaries cross shard
// boundaries, with a scalar constant, a cast, a comparison and select, and
// an intermediate that is also a function output.
TEST(FunctionExecutableFusionTest, FusedRunMatchesOpByOp) {
  constexpr int64_t n = 1500;  // 3 shards: 4500 elements, 5 tiles
  FunctionBuilder b("f", "");
  const int32_t x = b.Parameter(DType::kF32, {n});
  const int32_t y = b.Parameter(DType::kF32, {n});
  auto two = b.Constant(DType::kF32, {}, Bytes<float>({2.0f}));
  ASSERT_TRUE(two.ok());
  auto a = b.Binary(OpKind::kMul, x, *two);      // internal
  auto c = b.Binary(OpKind::kAdd, *a, y);        // output too
  auto t = b.Unary(OpKind::kTanh, *c);           // internal
  auto d = b.Convert(*t, DType::kF64);           // internal
  auto p = b.Binary(OpKind::kGt, x, y);          // internal (bool)
  auto one = b.Constant(DType::kF64, {}, Bytes<double>({1.0}));  // inside the run
  ASSERT_TRUE(one.ok());
  auto d1 = b.Binary(OpKind::kSub, *d, *one);    // internal
  auto e = b.Select(*p, *d1, *two);              // promotes: f64
  ASSERT_TRUE(a.ok() && c.ok() && t.ok() && d.ok() && p.ok() && d1.ok() && e.ok());
  auto exe = MustCompile(b.Build({*e, *c}));
  ASSERT_NE(exe, nullptr);
  ASSERT_EQ(exe->fusion_groups().size(), 1u);
  EXPECT_EQ(exe->fusion_groups()[0].first, a.value());
  EXPECT_EQ(exe->fusion_groups()[0].last, e.value());
  const int shards = 3;
  std::vector<float> xs(shards * n), ys(shards * n);
  for (size_t i = 0; i < xs.size(); ++i) {
    xs[i] = std::sin(0.01f * static_cast<float>(i));
    ys[i] = std::cos(0.013f * static_cast<float>(i));
  }
  int64_t allocations = -1;
  const auto out = RunGang(*exe, shards, {Bytes(xs), Bytes(ys)}, &allocations);
  EXPECT_EQ(allocations, 0);
  const auto got_e = Values<double>(out[0]);
  const auto got_c = Values<float>(out[1]);
  ASSERT_EQ(got_e.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const float cv = xs[i] * 2.0f + ys[i];
    ASSERT_EQ(got_c[i], cv) << i;
    float tv;  // the kernels' tanh (vector_math.h), correctly rounded where glibc's may not be
    Tanh(&cv, &tv, 1);
    const double ev = xs[i] > ys[i] ? static_cast<double>(tv) - 1.0 : 2.0;
    ASSERT_EQ(got_e[i], ev) << i;
  }
}


// --- RunLocal: a gang's shards split over hosts ---

using IrOr = absl::StatusOr<std::shared_ptr<const FunctionIr>>;

// One function per kind of cross-shard op, traced for a gang of `gang`
// shards over axis "i". Each also carries values of other dtypes and shapes,
// a constant operand (nothing to gather) and a scalar.
IrOr PsumFunction(int gang) {
  FunctionBuilder b("psum", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  const int32_t k = b.Parameter(DType::kI32, {5});  // large values: the sum wraps
  const int32_t s = b.Parameter(DType::kF64, {});
  const int32_t e = b.Parameter(DType::kF32, {0});  // nothing to gather
  const int32_t q = b.Parameter(DType::kBool, {3});  // psum of bool: counts, in int32
  PW_ASSIGN_OR_RETURN(const int32_t c, b.Constant(DType::kF32, {2}, Bytes<float>({0.1f, -3})));
  PW_ASSIGN_OR_RETURN(const int32_t px, b.Psum(x, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t pk, b.Psum(k, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t ps, b.Psum(s, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t pe, b.Psum(e, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t pc, b.Psum(c, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t pq, b.Psum(q, "i"));
  return b.Build({px, pk, ps, pe, pc, pq});
}

IrOr PmeanPmaxPminFunction(int gang) {
  FunctionBuilder b("pmean_pmax_pmin", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {4});
  const int32_t k = b.Parameter(DType::kI32, {3});
  const int32_t d = b.Parameter(DType::kF64, {2, 2});
  const int32_t q = b.Parameter(DType::kBool, {3});
  std::vector<int32_t> outs;
  for (OpKind kind : {OpKind::kPmean, OpKind::kPmax, OpKind::kPmin}) {
    for (int32_t v : {x, k, d, q}) {
      if (kind == OpKind::kPmean && v == q) continue;  // no pmean of bool
      PW_ASSIGN_OR_RETURN(const int32_t r, b.Pcollective(kind, v, "i"));
      outs.push_back(r);
    }
  }
  return b.Build(outs);
}

IrOr AllGatherFunction(int gang) {
  FunctionBuilder b("all_gather", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  const int32_t k = b.Parameter(DType::kI32, {});
  PW_ASSIGN_OR_RETURN(const int32_t g0, b.AllGather(x, "i", 0));
  PW_ASSIGN_OR_RETURN(const int32_t g1, b.AllGather(x, "i", 1));
  PW_ASSIGN_OR_RETURN(const int32_t g2, b.AllGather(x, "i", -1));
  PW_ASSIGN_OR_RETURN(const int32_t gk, b.AllGather(k, "i", 0));
  return b.Build({g0, g1, g2, gk});
}

IrOr PpermuteFunction(int gang) {
  FunctionBuilder b("ppermute", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {3});
  const int32_t k = b.Parameter(DType::kI32, {2});
  // Partial: only shards gang-1 and 1 receive; the others get zeros.
  PW_ASSIGN_OR_RETURN(const int32_t px, b.Ppermute(x, "i", {{0, gang - 1}, {gang - 1, 1}}));
  std::vector<std::pair<int64_t, int64_t>> shift;
  for (int s = 0; s < gang; ++s) shift.push_back({s, (s + 1) % gang});
  PW_ASSIGN_OR_RETURN(const int32_t pk, b.Ppermute(k, "i", shift));
  return b.Build({px, pk});
}

IrOr AllToAllFunction(int gang) {
  FunctionBuilder b("all_to_all", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {2, 2 * gang});
  const int32_t d = b.Parameter(DType::kF64, {gang, 3});
  PW_ASSIGN_OR_RETURN(const int32_t ax, b.AllToAll(x, "i", 1, 0));
  PW_ASSIGN_OR_RETURN(const int32_t ad, b.AllToAll(d, "i", 0, 1));
  return b.Build({ax, ad});
}

IrOr PsumScatterFunction(int gang) {
  FunctionBuilder b("psum_scatter", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {2, gang, 3});
  const int32_t k = b.Parameter(DType::kI32, {gang});
  PW_ASSIGN_OR_RETURN(const int32_t sx, b.PsumScatter(x, "i", 1));
  PW_ASSIGN_OR_RETURN(const int32_t sk, b.PsumScatter(k, "i", 0));
  return b.Build({sx, sk});
}

IrOr AxisIndexFunction(int gang) {
  FunctionBuilder b("axis_index", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t k = b.Parameter(DType::kI32, {4});
  PW_ASSIGN_OR_RETURN(const int32_t idx, b.AxisIndex("i"));
  PW_ASSIGN_OR_RETURN(const int32_t sum, b.Binary(OpKind::kAdd, k, idx));
  PW_ASSIGN_OR_RETURN(const int32_t f, b.Convert(idx, DType::kF32));
  return b.Build({idx, sum, f});
}

// Elementwise runs long enough to fuse over several tiles, matmuls and a
// reduction between collectives; axis_index scales a value.
IrOr MixedFunction(int gang) {
  FunctionBuilder b("mixed", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {40, 30});
  const int32_t w = b.Parameter(DType::kF32, {30, 8});
  PW_ASSIGN_OR_RETURN(const int32_t two, b.Constant(DType::kF32, {}, Bytes<float>({2.f})));
  PW_ASSIGN_OR_RETURN(const int32_t a, b.Binary(OpKind::kMul, x, two));
  PW_ASSIGN_OR_RETURN(const int32_t a1, b.Binary(OpKind::kAdd, a, x));
  PW_ASSIGN_OR_RETURN(const int32_t t, b.Unary(OpKind::kTanh, a1));
  PW_ASSIGN_OR_RETURN(const int32_t m, b.Matmul(t, w));  // f32[40,8]
  PW_ASSIGN_OR_RETURN(const int32_t p, b.Psum(m, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t q, b.Binary(OpKind::kSub, p, m));
  PW_ASSIGN_OR_RETURN(const int32_t q2, b.Binary(OpKind::kMul, q, q));
  PW_ASSIGN_OR_RETURN(const int32_t q3, b.Binary(OpKind::kAdd, q2, p));
  PW_ASSIGN_OR_RETURN(const int32_t mx, b.Pcollective(OpKind::kPmax, q3, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t idx, b.AxisIndex("i"));
  PW_ASSIGN_OR_RETURN(const int32_t fi, b.Convert(idx, DType::kF32));
  PW_ASSIGN_OR_RETURN(const int32_t r, b.Binary(OpKind::kMul, q, fi));
  const std::vector<int64_t> last = {1};
  PW_ASSIGN_OR_RETURN(const int32_t s, b.Reduce(ReduceKind::kSum, r, &last, false));  // f32[40]
  PW_ASSIGN_OR_RETURN(const int32_t g, b.AllGather(s, "i", 0));
  std::vector<std::pair<int64_t, int64_t>> shift;
  for (int i = 0; i < gang; ++i) shift.push_back({i, (i + gang - 1) % gang});
  PW_ASSIGN_OR_RETURN(const int32_t pp, b.Ppermute(t, "i", shift));
  PW_ASSIGN_OR_RETURN(const int32_t wt, b.Transpose(w, {1, 0}));
  PW_ASSIGN_OR_RETURN(const int32_t m2, b.Matmul(pp, w));
  PW_ASSIGN_OR_RETURN(const int32_t m3, b.Matmul(m2, wt));
  PW_ASSIGN_OR_RETURN(const int32_t pm, b.Pcollective(OpKind::kPmean, m3, "i"));
  return b.Build({p, mx, r, g, pp, pm, t});
}

// Cross-shard ops whose operand is a constant, and axis_index: nothing to
// gather, so a partial gang runs without collectives.
IrOr ConstantCollectivesFunction(int gang) {
  FunctionBuilder b("constant_collectives", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF32, {2});
  PW_ASSIGN_OR_RETURN(const int32_t c, b.Constant(DType::kF32, {2}, Bytes<float>({1.5f, -2})));
  PW_ASSIGN_OR_RETURN(const int32_t pc, b.Psum(c, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t mc, b.Pcollective(OpKind::kPmax, c, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t gc, b.AllGather(c, "i", 0));
  PW_ASSIGN_OR_RETURN(const int32_t idx, b.AxisIndex("i"));
  PW_ASSIGN_OR_RETURN(const int32_t fi, b.Convert(idx, DType::kF32));
  PW_ASSIGN_OR_RETURN(const int32_t y, b.Binary(OpKind::kMul, x, fi));
  PW_ASSIGN_OR_RETURN(const int32_t z, b.Binary(OpKind::kAdd, y, pc));
  return b.Build({pc, mc, gc, idx, z});
}

// bfloat16 across the gang: gathers, permutes and all_to_all move it as it
// is; psum, pmean, pmax and psum_scatter reduce it in float32.
IrOr BFloat16CollectivesFunction(int gang) {
  FunctionBuilder b("bfloat16", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t h = b.Parameter(DType::kBF16, {2, gang});
  const int32_t k = b.Parameter(DType::kI32, {gang});
  PW_ASSIGN_OR_RETURN(const int32_t kh, b.Binary(OpKind::kMul, k, h));  // bf16[2,gang]
  PW_ASSIGN_OR_RETURN(const int32_t g, b.AllGather(kh, "i", 1));
  std::vector<std::pair<int64_t, int64_t>> shift;
  for (int s = 0; s < gang; ++s) shift.push_back({s, (s + 1) % gang});
  PW_ASSIGN_OR_RETURN(const int32_t pp, b.Ppermute(h, "i", shift));
  PW_ASSIGN_OR_RETURN(const int32_t a2a, b.AllToAll(h, "i", 1, 0));
  PW_ASSIGN_OR_RETURN(const int32_t ps, b.Psum(kh, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t pm, b.Pcollective(OpKind::kPmean, h, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t mx, b.Pcollective(OpKind::kPmax, h, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t sc, b.PsumScatter(h, "i", 1));
  return b.Build({g, pp, a2a, ps, pm, mx, sc});
}

// Loops over the gang: a step whose body reads other shards (psum,
// all_gather, axis_index), forwards and reversed, with a const given as a
// parameter and as a constant; a loop in a loop whose inner body is local and
// whose outer body takes a pmax; a local loop (shard-parallel runs keep it
// inside its stage); and a length-0 loop, which calls nothing.
IrOr ScanGangFunction(int gang) {
  // step(c: f32[4], k: i32[], x: f32[4], w: f32[4])
  //   -> (tanh(c * w + psum(x)), k + axis_index, c * x, all_gather(c))
  FunctionBuilder step("step", "i");
  PW_RETURN_IF_ERROR(step.SetAxisSize(gang));
  const int32_t c = step.Parameter(DType::kF32, {4});
  const int32_t k = step.Parameter(DType::kI32, {});
  const int32_t x = step.Parameter(DType::kF32, {4});
  const int32_t w = step.Parameter(DType::kF32, {4});
  PW_ASSIGN_OR_RETURN(const int32_t cw, step.Binary(OpKind::kMul, c, w));
  PW_ASSIGN_OR_RETURN(const int32_t px, step.Psum(x, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t sum, step.Binary(OpKind::kAdd, cw, px));
  PW_ASSIGN_OR_RETURN(const int32_t t, step.Unary(OpKind::kTanh, sum));
  PW_ASSIGN_OR_RETURN(const int32_t idx, step.AxisIndex("i"));
  PW_ASSIGN_OR_RETURN(const int32_t k2, step.Binary(OpKind::kAdd, k, idx));
  PW_ASSIGN_OR_RETURN(const int32_t y, step.Binary(OpKind::kMul, c, x));
  PW_ASSIGN_OR_RETURN(const int32_t g, step.AllGather(c, "i", 0));
  PW_ASSIGN_OR_RETURN(auto step_fn, step.Build({t, k2, y, g}));
  // inner(a: f32[4], r: f32[4]) -> (a * 0.5 + r, a): no cross-shard op.
  FunctionBuilder inner("inner", "");
  const int32_t a = inner.Parameter(DType::kF32, {4});
  const int32_t r = inner.Parameter(DType::kF32, {4});
  PW_ASSIGN_OR_RETURN(const int32_t half, inner.Constant(DType::kF32, {}, Bytes<float>({0.5f})));
  PW_ASSIGN_OR_RETURN(const int32_t ah, inner.Binary(OpKind::kMul, a, half));
  PW_ASSIGN_OR_RETURN(const int32_t next, inner.Binary(OpKind::kAdd, ah, r));
  PW_ASSIGN_OR_RETURN(auto inner_fn, inner.Build({next, a}));
  // outer(c: f32[4], rows: f32[2,4]) -> (pmax(inner's carry), inner's ys)
  FunctionBuilder outer("outer", "i");
  PW_RETURN_IF_ERROR(outer.SetAxisSize(gang));
  const int32_t oc = outer.Parameter(DType::kF32, {4});
  const int32_t rows = outer.Parameter(DType::kF32, {2, 4});
  PW_ASSIGN_OR_RETURN(auto in, outer.ScanResults(inner_fn, {oc, rows}, 1, 1, 2, false));
  PW_ASSIGN_OR_RETURN(const int32_t top, outer.Pcollective(OpKind::kPmax, in[0], "i"));
  PW_ASSIGN_OR_RETURN(auto outer_fn, outer.Build({top, in[1]}));

  FunctionBuilder b("loops", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t c0 = b.Parameter(DType::kF32, {4});
  const int32_t k0 = b.Parameter(DType::kI32, {});
  const int32_t xs = b.Parameter(DType::kF32, {3, 4});
  const int32_t w0 = b.Parameter(DType::kF32, {4});
  const int32_t xs2 = b.Parameter(DType::kF32, {3, 2, 4});
  PW_ASSIGN_OR_RETURN(const int32_t wc,
                      b.Constant(DType::kF32, {4}, Bytes<float>({0.5f, -1, 2, 0.25f})));
  PW_ASSIGN_OR_RETURN(const int32_t none, b.Slice(xs, {0, 0}, {0, 4}, {1, 1}));
  std::vector<int32_t> outs;
  auto add = [&](absl::StatusOr<std::vector<int32_t>> r) -> absl::Status {
    PW_RETURN_IF_ERROR(r.status());
    outs.insert(outs.end(), r->begin(), r->end());
    return absl::OkStatus();
  };
  PW_RETURN_IF_ERROR(add(b.ScanResults(step_fn, {c0, k0, xs, w0}, 2, 1, 3, false)));
  PW_RETURN_IF_ERROR(add(b.ScanResults(step_fn, {c0, k0, xs, wc}, 2, 1, 3, true)));
  PW_RETURN_IF_ERROR(add(b.ScanResults(outer_fn, {c0, xs2}, 1, 1, 3, false)));
  PW_RETURN_IF_ERROR(add(b.ScanResults(inner_fn, {c0, xs}, 1, 1, 3, true)));
  PW_RETURN_IF_ERROR(add(b.ScanResults(step_fn, {c0, k0, none, w0}, 2, 1, 0, false)));
  return b.Build(outs);
}

// While loops over the gang. Every while here runs at most the gang's size
// iterations on any shard (WhileTrips): one whose trip count is each shard's
// position + 1 (so shards stop at different iterations) with a psum of the
// carries in its body; one whose cond takes a pmax (uniform count); and a
// local one whose trip count the inputs decide (shard-parallel runs keep it
// inside its stage).
IrOr WhileGangFunction(int gang) {
  // upto(c: f32[2], k: i32[]) -> k < axis_index + 1
  FunctionBuilder upto("upto", "i");
  PW_RETURN_IF_ERROR(upto.SetAxisSize(gang));
  upto.Parameter(DType::kF32, {2});
  const int32_t uk = upto.Parameter(DType::kI32, {});
  PW_ASSIGN_OR_RETURN(const int32_t idx, upto.AxisIndex("i"));
  PW_ASSIGN_OR_RETURN(const int32_t one, upto.Constant(DType::kI32, {}, Bytes<int32_t>({1})));
  PW_ASSIGN_OR_RETURN(const int32_t limit, upto.Binary(OpKind::kAdd, idx, one));
  PW_ASSIGN_OR_RETURN(const int32_t more, upto.Binary(OpKind::kLt, uk, limit));
  PW_ASSIGN_OR_RETURN(auto upto_fn, upto.Build({more}));
  // mix(c: f32[2], k: i32[]) -> (tanh(c + psum(c)), k + 1)
  FunctionBuilder mix("mix", "i");
  PW_RETURN_IF_ERROR(mix.SetAxisSize(gang));
  const int32_t mc = mix.Parameter(DType::kF32, {2});
  const int32_t mk = mix.Parameter(DType::kI32, {});
  PW_ASSIGN_OR_RETURN(const int32_t total, mix.Psum(mc, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t sum, mix.Binary(OpKind::kAdd, mc, total));
  PW_ASSIGN_OR_RETURN(const int32_t t, mix.Unary(OpKind::kTanh, sum));
  PW_ASSIGN_OR_RETURN(const int32_t mone, mix.Constant(DType::kI32, {}, Bytes<int32_t>({1})));
  PW_ASSIGN_OR_RETURN(const int32_t mk1, mix.Binary(OpKind::kAdd, mk, mone));
  PW_ASSIGN_OR_RETURN(auto mix_fn, mix.Build({t, mk1}));
  // below(c: f32[2], k: i32[]) -> pmax(k) < gang
  FunctionBuilder below("below", "i");
  PW_RETURN_IF_ERROR(below.SetAxisSize(gang));
  below.Parameter(DType::kF32, {2});
  const int32_t bk = below.Parameter(DType::kI32, {});
  PW_ASSIGN_OR_RETURN(const int32_t top, below.Pcollective(OpKind::kPmax, bk, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t n, below.Constant(DType::kI32, {}, Bytes<int32_t>({gang})));
  PW_ASSIGN_OR_RETURN(auto below_fn, below.Build({*below.Binary(OpKind::kLt, top, n)}));
  // big(h: f64[], k: i32[]) -> k < 40 & |h| > 1;  halve(h, k) -> (h * 0.5, k + 1)
  FunctionBuilder big("big", "");
  const int32_t gh = big.Parameter(DType::kF64, {});
  const int32_t gk = big.Parameter(DType::kI32, {});
  PW_ASSIGN_OR_RETURN(const int32_t forty, big.Constant(DType::kI32, {}, Bytes<int32_t>({40})));
  PW_ASSIGN_OR_RETURN(const int32_t bound, big.Binary(OpKind::kLt, gk, forty));
  PW_ASSIGN_OR_RETURN(const int32_t unit, big.Constant(DType::kF64, {}, Bytes<double>({1.0})));
  PW_ASSIGN_OR_RETURN(const int32_t large,
                      big.Binary(OpKind::kGt, *big.Unary(OpKind::kAbs, gh), unit));
  PW_ASSIGN_OR_RETURN(auto big_fn, big.Build({*big.Binary(OpKind::kAnd, bound, large)}));
  FunctionBuilder halve("halve", "");
  const int32_t hh = halve.Parameter(DType::kF64, {});
  const int32_t hk = halve.Parameter(DType::kI32, {});
  PW_ASSIGN_OR_RETURN(const int32_t half, halve.Constant(DType::kF64, {}, Bytes<double>({0.5})));
  PW_ASSIGN_OR_RETURN(const int32_t hone, halve.Constant(DType::kI32, {}, Bytes<int32_t>({1})));
  PW_ASSIGN_OR_RETURN(auto halve_fn, halve.Build({*halve.Binary(OpKind::kMul, hh, half),
                                                  *halve.Binary(OpKind::kAdd, hk, hone)}));

  FunctionBuilder b("whiles", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t c0 = b.Parameter(DType::kF32, {2});
  const int32_t h0 = b.Parameter(DType::kF64, {});
  PW_ASSIGN_OR_RETURN(const int32_t zero, b.Constant(DType::kI32, {}, Bytes<int32_t>({0})));
  std::vector<int32_t> outs;
  auto add = [&](absl::StatusOr<std::vector<int32_t>> r) -> absl::Status {
    PW_RETURN_IF_ERROR(r.status());
    outs.insert(outs.end(), r->begin(), r->end());
    return absl::OkStatus();
  };
  PW_RETURN_IF_ERROR(add(b.WhileResults(upto_fn, mix_fn, {c0, zero}, 2)));
  PW_RETURN_IF_ERROR(add(b.WhileResults(below_fn, mix_fn, {c0, zero}, 2)));
  PW_RETURN_IF_ERROR(add(b.WhileResults(big_fn, halve_fn, {h0, zero}, 2)));
  return b.Build(outs);
}

// The most iterations a while of kGangFunctions runs on any shard: the
// gang's size (WhileGangFunction).
int64_t WhileTrips(const FunctionIr& ir) { return ir.axis_size(); }

// Decompositions around a collective: the thin svd of a batch of float64
// matrices, a psum of its singular values (which closes a stage), then the
// full svd of a float32 matrix scaled by it.
IrOr SvdGangFunction(int gang) {
  FunctionBuilder b("svd", "i");
  PW_RETURN_IF_ERROR(b.SetAxisSize(gang));
  const int32_t x = b.Parameter(DType::kF64, {2, 5, 3});
  const int32_t y = b.Parameter(DType::kF32, {3, 4});
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> thin, b.SvdResults(x, false));
  PW_ASSIGN_OR_RETURN(const int32_t total, b.Psum(thin[1], "i"));
  PW_ASSIGN_OR_RETURN(const int32_t first, b.Reduce(ReduceKind::kMax, total, nullptr, false));
  PW_ASSIGN_OR_RETURN(const int32_t scale, b.Convert(first, DType::kF32));
  PW_ASSIGN_OR_RETURN(const int32_t ys, b.Binary(OpKind::kMul, y, scale));
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> full, b.SvdResults(ys, true));
  // A solve through an LU decomposition: vt x = u[:3], both stages' values.
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> lu, b.LuResults(full[2]));
  PW_ASSIGN_OR_RETURN(const int32_t rows, b.Slice(full[0], {0, 0}, {3, 3}, {1, 1}));
  PW_ASSIGN_OR_RETURN(const int32_t permuted, b.Take(rows, lu[2], 0));
  PW_ASSIGN_OR_RETURN(const int32_t lower, b.TriangularSolve(lu[0], permuted, true, true, false));
  PW_ASSIGN_OR_RETURN(const int32_t solved, b.TriangularSolve(lu[0], lower, false, false, false));
  // The eigendecomposition of u u^T + I (symmetric), and its Cholesky factor.
  PW_ASSIGN_OR_RETURN(const int32_t ut, b.Transpose(full[0], {1, 0}));
  PW_ASSIGN_OR_RETURN(const int32_t uut, b.Matmul(full[0], ut));
  PW_ASSIGN_OR_RETURN(const int32_t one, b.Constant(DType::kF32, {}, Bytes<float>({1.0f})));
  PW_ASSIGN_OR_RETURN(const int32_t spd, b.Binary(OpKind::kAdd, uut, one));
  PW_ASSIGN_OR_RETURN(std::vector<int32_t> eigh, b.EighResults(spd));
  PW_ASSIGN_OR_RETURN(const int32_t chol, b.Cholesky(spd));
  return b.Build({thin[0], thin[1], thin[2], total, full[0], full[1], full[2], lu[0], lu[1], lu[2],
                  solved, eigh[0], eigh[1], chol});
}

struct GangFunction {
  const char* name;
  IrOr (*trace)(int gang);
};

constexpr GangFunction kGangFunctions[] = {
    {"psum", PsumFunction},
    {"pmean_pmax_pmin", PmeanPmaxPminFunction},
    {"all_gather", AllGatherFunction},
    {"ppermute", PpermuteFunction},
    {"all_to_all", AllToAllFunction},
    {"psum_scatter", PsumScatterFunction},
    {"axis_index", AxisIndexFunction},
    {"mixed", MixedFunction},
    {"constant_collectives", ConstantCollectivesFunction},
    {"bfloat16", BFloat16CollectivesFunction},
    {"scan", ScanGangFunction},
    {"while", WhileGangFunction},
    {"svd", SvdGangFunction},
};

// Whether `ir` (its loop bodies included) psums or pmeans a float value
// that is not a constant of the function.
bool HasFloatSum(const FunctionIr& ir) {
  for (const Op& op : ir.ops()) {
    if ((op.kind == OpKind::kPsum || op.kind == OpKind::kPmean) &&
        ir.ops()[op.operands[0]].kind != OpKind::kConstant &&
        (op.type.dtype == DType::kF32 || op.type.dtype == DType::kF64)) {
      return true;
    }
    if (op.body != nullptr && HasFloatSum(*op.body)) return true;
    if (op.cond != nullptr && HasFloatSum(*op.cond)) return true;
  }
  return false;
}

// The AllReduce calls a run of `ir` on a partial gang makes: one per
// cross-shard reduction of a non-constant, nonempty operand, each loop's
// body's as many times as it runs.
int64_t Reductions(const FunctionIr& ir) {
  int64_t n = 0;
  for (const Op& op : ir.ops()) {
    if ((op.kind == OpKind::kPsum || op.kind == OpKind::kPmean || op.kind == OpKind::kPmax ||
         op.kind == OpKind::kPmin) &&
        ir.ops()[op.operands[0]].kind != OpKind::kConstant && op.type.num_elements() > 0) {
      ++n;
    }
    if (op.kind == OpKind::kScan) n += op.length * Reductions(*op.body);
    if (op.kind == OpKind::kWhile) {
      // The cond before each iteration and after the last; the hosts'
      // agreement with it when the loop calls the gang's collectives.
      const int64_t trips = WhileTrips(ir);
      const int64_t per_cond = Reductions(*op.cond);
      const int64_t per_body = Reductions(*op.body);
      const bool agree = per_cond + per_body > 0;
      n += trips * per_body + (trips + 1) * (per_cond + (agree ? 1 : 0));
    }
  }
  return n;
}

// Every parameter's value for the whole gang (shard-major), varied per
// element and shard: int32 values large enough that sums wrap, floats of
// mixed signs and magnitudes (so the order of a sum shows in its bits).
std::vector<std::vector<uint8_t>> GangInputs(const FunctionExecutable& exe, int gang) {
  std::vector<std::vector<uint8_t>> inputs;
  for (int i = 0; i < exe.ir().num_params(); ++i) {
    const ValueType& type = exe.ir().param_type(i);
    const int64_t count = type.num_elements() * gang;
    std::vector<uint8_t> bytes(type.num_bytes() * gang);
    for (int64_t j = 0; j < count; ++j) {
      const double v = std::sin(0.37 * static_cast<double>(j) + i) * std::pow(10.0, j % 7 - 3);
      switch (type.dtype) {
        case DType::kF32: {
          const float f = static_cast<float>(v);
          std::memcpy(bytes.data() + j * 4, &f, 4);
          break;
        }
        case DType::kF64:
          std::memcpy(bytes.data() + j * 8, &v, 8);
          break;
        case DType::kI32:
        case DType::kU32: {
          const int32_t k = static_cast<int32_t>(static_cast<uint32_t>(j + i) * 2654435761u);
          std::memcpy(bytes.data() + j * 4, &k, 4);
          break;
        }
        case DType::kBool:
          bytes[j] = j % 3 == 0;
          break;
        case DType::kBF16: {
          const BFloat16 h = FloatToBFloat16(static_cast<float>(v));
          std::memcpy(bytes.data() + j * 2, &h.bits, 2);
          break;
        }
      }
    }
    inputs.push_back(std::move(bytes));
  }
  return inputs;
}

// Shards `positions` of a shard-major buffer of `shard_bytes` per shard.
std::vector<uint8_t> Rows(const std::vector<uint8_t>& gang_value, int64_t shard_bytes,
                          absl::Span<const int> positions) {
  std::vector<uint8_t> rows;
  for (int p : positions) {
    rows.insert(rows.end(), gang_value.begin() + p * shard_bytes,
                gang_value.begin() + (p + 1) * shard_bytes);
  }
  return rows;
}

// The hosts of one gang as threads of this process. Each call is a barrier:
// each host posts its data, waits for every host's, reads them all (AllGather
// copies every host's shards into `full`; AllReduce reduces the hosts' values
// in host order into a buffer of its own, then copies that into `data`),
// then waits again so no host reuses its buffer before the others have read
// it. Hosts making different calls (kind or sizes) get InternalError. A host
// that waits 10 s breaks the gang: every waiting and later call fails
// (DeadlineExceeded), so a host that skips a call fails the test instead of
// hanging it.
class ThreadedGang {
 public:
  // The largest AllReduce, in bytes (its result buffers are made up front,
  // so calls allocate nothing).
  static constexpr int64_t kMaxReduceBytes = 1 << 16;

  explicit ThreadedGang(std::vector<std::vector<int>> hosts)
      : hosts_(std::move(hosts)),
        posted_(hosts_.size()),
        posted_bytes_(hosts_.size()),
        calls_(hosts_.size()),
        reduce_calls_(hosts_.size()) {
    for (size_t h = 0; h < hosts_.size(); ++h) members_.emplace_back(this, static_cast<int>(h));
    reduced_.assign(hosts_.size(), std::vector<uint8_t>(kMaxReduceBytes));
  }

  GangCollectives* collectives(int host) { return &members_[host]; }

  // Calls (AllGather and AllReduce) made by `host` so far.
  int64_t calls(int host) {
    MutexLock lock(&mu_);
    return calls_[host];
  }
  // AllReduce calls made by `host` so far.
  int64_t reduce_calls(int host) {
    MutexLock lock(&mu_);
    return reduce_calls_[host];
  }

 private:
  class Member : public GangCollectives {
   public:
    Member(ThreadedGang* gang, int host) : gang_(gang), host_(host) {}
    absl::Status AllGather(const void* local, void* full, int64_t shard_bytes) override {
      return gang_->AllGather(host_, local, full, shard_bytes);
    }
    absl::Status AllReduce(DType dtype, ReduceOp op, void* data, int64_t count) override {
      return gang_->AllReduce(host_, dtype, op, data, count);
    }

   private:
    ThreadedGang* gang_;
    int host_;
  };

  // What a call is, for checking that every host makes the same one.
  static int64_t Signature(bool reduce, DType dtype, ReduceOp op, int64_t size) {
    return reduce ? -(size * 64 + static_cast<int64_t>(dtype) * 8 + static_cast<int64_t>(op) + 1) : size;
  }

  absl::Status CheckSignaturesLocked(int host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t h = 0; h < hosts_.size(); ++h) {
      if (posted_bytes_[h] != posted_bytes_[host]) {
        return absl::InternalError(absl::StrCat("host ", h, " makes call ", posted_bytes_[h], ", host ", host,
                                                " call ", posted_bytes_[host]));
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  static T Combine(ReduceOp op, T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
      return op == ReduceOp::kMax ? (a || b) : (a && b);
    } else if constexpr (std::is_same_v<T, int32_t>) {
      if (op == ReduceOp::kSum) return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
      return op == ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
    } else {
      if (op == ReduceOp::kSum) return a + b;
      if (a != a || b != b) return a != a ? a : b;  // NOLINT: NaN wins
      return op == ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
    }
  }

  absl::Status AllReduce(int host, DType dtype, ReduceOp op, void* data, int64_t count) {
    MutexLock lock(&mu_);
    ++calls_[host];
    ++reduce_calls_[host];
    posted_[host] = data;
    posted_bytes_[host] = Signature(true, dtype, op, count);
    PW_RETURN_IF_ERROR(BarrierLocked());
    PW_RETURN_IF_ERROR(CheckSignaturesLocked(host));
    if (dtype == DType::kBool && op == ReduceOp::kSum) return absl::InternalError("AllReduce: sum of bool");
    if (count * DTypeSize(dtype) > kMaxReduceBytes) return absl::InternalError("AllReduce: too large for the test");
    uint8_t* result = reduced_[host].data();
    auto reduce = [&](auto* tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      using T = std::remove_pointer_t<decltype(tag)>;
      T* r = reinterpret_cast<T*>(result);
      for (int64_t j = 0; j < count; ++j) {
        r[j] = static_cast<const T*>(posted_[0])[j];
        for (size_t h = 1; h < hosts_.size(); ++h) r[j] = Combine<T>(op, r[j], static_cast<const T*>(posted_[h])[j]);
      }
    };
    switch (dtype) {
      case DType::kF32:
        reduce(static_cast<float*>(nullptr));
        break;
      case DType::kF64:
        reduce(static_cast<double*>(nullptr));
        break;
      case DType::kI32:
        reduce(static_cast<int32_t*>(nullptr));
        break;
      case DType::kU32:
        reduce(static_cast<uint32_t*>(nullptr));
        break;
      case DType::kBool:
        reduce(static_cast<bool*>(nullptr));
        break;
      case DType::kBF16:  // never reduced: the builder reduces it in float32
        break;
    }
    PW_RETURN_IF_ERROR(BarrierLocked());
    if (count > 0) std::memcpy(data, result, count * DTypeSize(dtype));
    return absl::OkStatus();
  }

  absl::Status AllGather(int host, const void* local, void* full, int64_t shard_bytes) {
    MutexLock lock(&mu_);
    ++calls_[host];
    posted_[host] = local;
    posted_bytes_[host] = Signature(false, DType::kF32, ReduceOp::kSum, shard_bytes);
    PW_RETURN_IF_ERROR(BarrierLocked());
    PW_RETURN_IF_ERROR(CheckSignaturesLocked(host));
    for (size_t h = 0; h < hosts_.size(); ++h) {
      const auto* src = static_cast<const uint8_t*>(posted_[h]);
      for (size_t k = 0; k < hosts_[h].size(); ++k) {
        std::memcpy(static_cast<uint8_t*>(full) + hosts_[h][k] * shard_bytes,
                    src + k * shard_bytes, shard_bytes);
      }
    }
    return BarrierLocked();
  }

  absl::Status BarrierLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t generation = generation_;
    if (++arrived_ == static_cast<int>(hosts_.size())) {
      arrived_ = 0;
      ++generation_;
      cv_.SignalAll();
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (generation_ == generation && !broken_) {
      if (!cv_.WaitUntil(&mu_, deadline)) {
        broken_ = true;
        cv_.SignalAll();
      }
    }
    if (broken_) return absl::DeadlineExceededError("a host of the gang never came");
    return absl::OkStatus();
  }

  const std::vector<std::vector<int>> hosts_;
  std::deque<Member> members_;
  Mutex mu_;
  CondVar cv_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<const void*> posted_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> posted_bytes_ ABSL_GUARDED_BY(mu_);  // each host's call's Signature
  std::vector<int64_t> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> reduce_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint8_t>> reduced_;  // per host: its AllReduce result
};

// What one host runs: its local shards' inputs, outputs and scratch, all
// starting as garbage (0xff) like RunGang's.
struct HostRun {
  LocalShards local;
  std::vector<std::vector<uint8_t>> inputs, outputs;
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<Block> scratch;
  absl::Status status;

  HostRun(const FunctionExecutable& exe, LocalShards local_shards,
          const std::vector<std::vector<uint8_t>>& gang_inputs)
      : local(std::move(local_shards)) {
    for (int i = 0; i < exe.ir().num_params(); ++i) {
      inputs.push_back(Rows(gang_inputs[i], exe.param_bytes(i), local.positions()));
      in.push_back(inputs.back().data());
    }
    for (int i = 0; i < exe.ir().num_outputs(); ++i) {
      outputs.emplace_back(exe.output_bytes(i) * local.num_local(), 0xff);
    }
    for (auto& o : outputs) out.push_back(o.data());
    scratch.resize((exe.local_scratch_bytes(local.num_local(), local.gang_size()) + 63) / 64);
    if (!scratch.empty()) std::memset(scratch.data(), 0xff, scratch.size() * sizeof(Block));
  }

  void Run(const FunctionExecutable& exe, GangCollectives* collectives) {
    status = exe.RunLocal(local, in, out, scratch.data(), collectives);
  }

  // Every output byte equals the rows of this host's positions in `gang`,
  // except in the outputs that `near` marks (floating point, computed from a
  // float psum or pmean: RunLocal adds in another order than Run()), which
  // must be within a tight tolerance of them.
  void ExpectOutputsAre(const FunctionExecutable& exe, const std::vector<std::vector<uint8_t>>& gang,
                        const std::vector<bool>& near = {}) const {
    ASSERT_TRUE(status.ok()) << status;
    for (int i = 0; i < exe.ir().num_outputs(); ++i) {
      const std::vector<uint8_t> want = Rows(gang[i], exe.output_bytes(i), local.positions());
      const DType dtype = exe.ir().output_type(i).dtype;
      if (i < static_cast<int>(near.size()) && near[i]) {
        if (dtype == DType::kF32) {
          ExpectNormwiseNear<float>(outputs[i], want, 1e-5, i);
          continue;
        }
        if (dtype == DType::kF64) {
          ExpectNormwiseNear<double>(outputs[i], want, 1e-12, i);
          continue;
        }
        if (dtype == DType::kBF16) {  // a float32 sum in another order, rounded: an ulp apart
          ExpectNormwiseNear<float>(Widened(outputs[i]), Widened(want), 1e-2, i);
          continue;
        }
      }
      EXPECT_TRUE(outputs[i] == want) << "output " << i << " (" << exe.ir().output_type(i).ToString() << ")";
    }
  }

  // bfloat16 bytes as float32 bytes (exact).
  static std::vector<uint8_t> Widened(const std::vector<uint8_t>& bf16_bytes) {
    std::vector<uint8_t> out(bf16_bytes.size() * 2);
    for (size_t j = 0; j < bf16_bytes.size() / 2; ++j) {
      BFloat16 h;
      std::memcpy(&h.bits, bf16_bytes.data() + 2 * j, 2);
      const float f = BFloat16ToFloat(h);
      std::memcpy(out.data() + 4 * j, &f, 4);
    }
    return out;
  }

  // |got - want| <= rtol * max |want| elementwise (NaN only where want is).
  template <typename T>
  static void ExpectNormwiseNear(const std::vector<uint8_t>& got_bytes, const std::vector<uint8_t>& want_bytes,
                                 double rtol, int output) {
    ASSERT_EQ(got_bytes.size(), want_bytes.size());
    std::vector<T> got(got_bytes.size() / sizeof(T)), want(got.size());
    if (got.empty()) return;  // (memcpy of nothing from a null pointer is undefined)
    std::memcpy(got.data(), got_bytes.data(), got_bytes.size());
    std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
    double scale = 0;
    for (T w : want) scale = std::isnan(w) ? scale : std::max(scale, std::abs(static_cast<double>(w)));
    for (size_t j = 0; j < got.size(); ++j) {
      if (std::isnan(want[j])) {
        EXPECT_TRUE(std::isnan(got[j])) << "output " << output << " element " << j;
        continue;
      }
      EXPECT_LE(std::abs(static_cast<double>(got[j]) - static_cast<double>(want[j])), rtol * scale)
          << "output " << output << " element " << j << ": " << got[j] << " vs " << want[j];
    }
  }
};

// Per output of `ir`: whether it is floating point and depends on a psum or
// pmean of a non-constant float operand, whose sum a partial gang adds in
// another order (local shards, then hosts) than Run().
std::vector<bool> AfterFloatSums(const FunctionIr& ir) {
  const absl::Span<const Op> ops = ir.ops();
  std::vector<bool> after(ops.size(), false);
  for (size_t v = 0; v < ops.size(); ++v) {
    const Op& op = ops[v];
    for (int32_t u : op.operands) after[v] = after[v] || after[u];
    if ((op.kind == OpKind::kPsum || op.kind == OpKind::kPmean) &&
        ops[op.operands[0]].kind != OpKind::kConstant &&
        (op.type.dtype == DType::kF32 || op.type.dtype == DType::kF64)) {
      after[v] = true;
    }
    if (IsLoopOp(op.kind) &&
        (HasFloatSum(*op.body) || (op.cond != nullptr && HasFloatSum(*op.cond)))) {
      after[v] = true;
    }
  }
  std::vector<bool> outputs;
  for (int i = 0; i < ir.num_outputs(); ++i) {
    outputs.push_back(after[ir.outputs()[i]] && IsFloat(ir.output_type(i).dtype));
  }
  return outputs;
}

LocalShards MustLocalShards(int gang_size, std::vector<int> positions) {
  auto local = LocalShards::Create(gang_size, std::move(positions));
  EXPECT_TRUE(local.ok()) << local.status();
  return *std::move(local);
}

// Splits of a gang over hosts: interleaved and uneven.
struct GangSplit {
  int gang_size;
  std::vector<std::vector<int>> hosts;
};
std::vector<GangSplit> GangSplits() {
  return {
      {4, {{0, 2}, {1, 3}}},
      {4, {{0}, {1, 2, 3}}},
      {4, {{3}, {0}, {1, 2}}},
      {3, {{0, 2}, {1}}},
      {3, {{0}, {1, 2}}},
  };
}

// Every function, split over hosts that each run RunLocal on a thread of
// their own, gives each host exactly (byte for byte) its rows of Run() over
// the whole gang, except float values computed from a float psum or pmean:
// RunLocal reduces the local shards first, then across hosts, so those sums
// add in another order and may differ in their last bits; they must be
// within a tight tolerance (1e-5 of the output's largest magnitude for f32,
// 1e-12 for f64). Integer, bool, max and min results and every gather stay
// bit for bit. Nothing allocates while the hosts run.
TEST(FunctionExecutableRunLocalTest, HostsMatchTheWholeGang) {
  for (const GangSplit& split : GangSplits()) {
    for (const GangFunction& f : kGangFunctions) {
      std::string hosts_text;
      for (const std::vector<int>& positions : split.hosts) {
        absl::StrAppend(&hosts_text, "{", absl::StrJoin(positions, ","), "}");
      }
      SCOPED_TRACE(testing::Message() << f.name << " gang=" << split.gang_size << " hosts="
                                      << hosts_text);
      auto exe = MustCompile(f.trace(split.gang_size));
      ASSERT_NE(exe, nullptr);
      if (std::string(f.name) == "mixed") {  // cross-shard ops sit between fused runs
        EXPECT_GE(exe->fusion_groups().size(), 2u);
      }
      const auto gang_inputs = GangInputs(*exe, split.gang_size);
      const auto expected = RunGang(*exe, split.gang_size, gang_inputs);
      ThreadedGang gang(split.hosts);
      std::deque<HostRun> hosts;
      for (const std::vector<int>& positions : split.hosts) {
        hosts.emplace_back(*exe, MustLocalShards(split.gang_size, positions), gang_inputs);
      }
      std::atomic<bool> go{false};
      std::vector<std::thread> threads;
      for (size_t h = 0; h < hosts.size(); ++h) {
        threads.emplace_back([&, h] {
          while (!go.load()) std::this_thread::yield();
          hosts[h].Run(*exe, gang.collectives(static_cast<int>(h)));
        });
      }
      StartCountingAllocations();
      go = true;
      for (std::thread& t : threads) t.join();
      EXPECT_EQ(StopCountingAllocations(), 0);
      const std::vector<bool> near = AfterFloatSums(exe->ir());
      for (size_t h = 0; h < hosts.size(); ++h) {
        SCOPED_TRACE(testing::Message() << "host " << h);
        hosts[h].ExpectOutputsAre(*exe, expected, near);
        EXPECT_EQ(gang.calls(static_cast<int>(h)), gang.calls(0));
        EXPECT_EQ(gang.reduce_calls(static_cast<int>(h)), gang.reduce_calls(0));
      }
      // One AllReduce per reduction (per iteration in a loop), no gather.
      EXPECT_EQ(gang.reduce_calls(0), Reductions(exe->ir()));
      if (std::string(f.name) == "constant_collectives" || std::string(f.name) == "axis_index") {
        EXPECT_EQ(gang.calls(0), 0);  // constants and positions need nothing from other hosts
      } else {
        EXPECT_GT(gang.calls(0), 0);
      }
    }
  }
}

// A gang split into parts that run each stage on threads of their own
// (RunStage; the last part to finish a stage runs its collective, as
// GangTask does) computes exactly Run()'s bytes: shards are computed alone
// between cross-shard ops, in the same order of operations. Nothing
// allocates while the parts run.
TEST(FunctionExecutableStagesTest, PartsOnThreadsMatchRun) {
  for (int gang_size : {3, 4}) {
    for (int num_parts = 2; num_parts <= gang_size; ++num_parts) {
      for (const GangFunction& f : kGangFunctions) {
        SCOPED_TRACE(testing::Message() << f.name << " gang=" << gang_size << " parts=" << num_parts);
        auto exe = MustCompile(f.trace(gang_size));
        ASSERT_NE(exe, nullptr);
        int collectives = 0;  // and loops whose bodies have them: they close a stage too
        for (const Op& op : exe->ir().ops()) {
          collectives += IsCollectiveOp(op.kind) ||
                         (IsLoopOp(op.kind) && (op.body->has_collectives() ||
                                                (op.cond != nullptr && op.cond->has_collectives())));
        }
        EXPECT_EQ(exe->num_stages(), collectives + 1);
        const auto inputs = GangInputs(*exe, gang_size);
        const auto expected = RunGang(*exe, gang_size, inputs);
        std::vector<const void*> in;
        for (const auto& i : inputs) in.push_back(i.data());
        std::vector<std::vector<uint8_t>> outputs;
        std::vector<void*> out;
        for (int i = 0; i < exe->ir().num_outputs(); ++i) {
          outputs.emplace_back(exe->output_bytes(i) * gang_size, 0xff);
        }
        for (auto& o : outputs) out.push_back(o.data());
        const int64_t shared_bytes = exe->shared_scratch_bytes(gang_size);
        void* shared = exe->AcquireSharedScratch(shared_bytes);
        std::memset(shared, 0xff, static_cast<size_t>(shared_bytes));
        std::vector<std::vector<Block>> tiles(num_parts);
        for (auto& t : tiles) t.resize(static_cast<size_t>(exe->tile_bytes() / 64 + 1));
        std::atomic<int> stage{0};
        std::atomic<int> left{num_parts};
        std::atomic<int> stage_done{0};
        std::vector<std::thread> threads;
        std::atomic<bool> go{false};
        for (int p = 0; p < num_parts; ++p) {
          threads.emplace_back([&, p] {
            while (!go.load()) std::this_thread::yield();
            const int begin = gang_size * p / num_parts;
            const int end = gang_size * (p + 1) / num_parts;
            for (int k = 0; k < exe->num_stages(); ++k) {
              while (stage.load(std::memory_order_acquire) != k) std::this_thread::yield();
              exe->RunStage(k, gang_size, begin, end, in, out, shared, tiles[p].data());
              if (left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                exe->RunStageCollective(k, gang_size, in, shared);
                left.store(num_parts, std::memory_order_relaxed);
                stage_done.fetch_add(1);
                stage.store(k + 1, std::memory_order_release);
              }
            }
          });
        }
        StartCountingAllocations();
        go = true;
        for (std::thread& t : threads) t.join();
        EXPECT_EQ(StopCountingAllocations(), 0);
        EXPECT_EQ(stage_done.load(), exe->num_stages());
        exe->ReleaseSharedScratch(shared, shared_bytes);
        for (size_t i = 0; i < outputs.size(); ++i) EXPECT_EQ(outputs[i], expected[i]) << i;
      }
    }
  }
}

// A host holding the whole gang gathers nothing: with no collectives,
// RunLocal is Run() (same scratch size, no allocation).
TEST(FunctionExecutableRunLocalTest, WholeGangNeedsNoCollectives) {
  for (int gang_size : {3, 4}) {
    for (const GangFunction& f : kGangFunctions) {
      SCOPED_TRACE(testing::Message() << f.name << " gang=" << gang_size);
      auto exe = MustCompile(f.trace(gang_size));
      ASSERT_NE(exe, nullptr);
      EXPECT_EQ(exe->local_scratch_bytes(gang_size, gang_size), exe->scratch_bytes(gang_size));
      std::vector<int> all(gang_size);
      for (int p = 0; p < gang_size; ++p) all[p] = p;
      const auto gang_inputs = GangInputs(*exe, gang_size);
      const auto expected = RunGang(*exe, gang_size, gang_inputs);
      HostRun host(*exe, MustLocalShards(gang_size, all), gang_inputs);
      StartCountingAllocations();
      host.Run(*exe, nullptr);
      EXPECT_EQ(StopCountingAllocations(), 0);
      host.ExpectOutputsAre(*exe, expected);
    }
  }
}

// Returns `status` from every call, counting the calls.
class FailingCollectives : public GangCollectives {
 public:
  explicit FailingCollectives(absl::Status status) : status_(std::move(status)) {}
  absl::Status AllGather(const void*, void*, int64_t) override {
    ++calls_;
    return status_;
  }
  absl::Status AllReduce(DType, ReduceOp, void*, int64_t) override {
    ++calls_;
    return status_;
  }
  int calls() const { return calls_; }

 private:
  absl::Status status_;
  int calls_ = 0;
};

TEST(FunctionExecutableRunLocalTest, CollectiveErrorEndsTheRun) {
  auto exe = MustCompile(MixedFunction(4));
  ASSERT_NE(exe, nullptr);
  const absl::Status lost = absl::UnavailableError("host 1 of the gang is gone");
  FailingCollectives collectives(lost);
  HostRun host(*exe, MustLocalShards(4, {0, 2}), GangInputs(*exe, 4));
  host.Run(*exe, &collectives);
  EXPECT_EQ(host.status, lost);
  EXPECT_EQ(collectives.calls(), 1);  // stopped at the first collective (its psum's AllReduce)
}

TEST(FunctionExecutableRunLocalTest, PartialGangWithoutCollectives) {
  // A function that gathers cannot run a partial gang without collectives...
  auto gathers = MustCompile(PsumFunction(4));
  ASSERT_NE(gathers, nullptr);
  HostRun host(*gathers, MustLocalShards(4, {1, 3}), GangInputs(*gathers, 4));
  host.Run(*gathers, nullptr);
  EXPECT_EQ(host.status.code(), absl::StatusCode::kInvalidArgument) << host.status;
  // ... one whose cross-shard ops read only constants can.
  auto constants = MustCompile(ConstantCollectivesFunction(4));
  ASSERT_NE(constants, nullptr);
  const auto gang_inputs = GangInputs(*constants, 4);
  HostRun part(*constants, MustLocalShards(4, {1, 3}), gang_inputs);
  part.Run(*constants, nullptr);
  part.ExpectOutputsAre(*constants, RunGang(*constants, 4, gang_inputs));
}

TEST(FunctionExecutableRunLocalTest, GangSizeMustMatchTheTracedAxisSize) {
  auto exe = MustCompile(PsumFunction(4));
  ASSERT_NE(exe, nullptr);
  FailingCollectives collectives(absl::OkStatus());
  HostRun host(*exe, MustLocalShards(3, {0, 2}), GangInputs(*exe, 3));
  host.Run(*exe, &collectives);
  EXPECT_EQ(host.status.code(), absl::StatusCode::kInvalidArgument) << host.status;
  EXPECT_EQ(collectives.calls(), 0);
}

TEST(FunctionExecutableRunLocalTest, LocalShardsAreValidated) {
  auto code = [](int gang_size, std::vector<int> positions) {
    return LocalShards::Create(gang_size, std::move(positions)).status().code();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(0, {0}), kInvalid);
  EXPECT_EQ(code(static_cast<int>(kMaxAxisSize) + 1, {0}), kInvalid);
  EXPECT_EQ(code(4, {}), kInvalid);
  EXPECT_EQ(code(4, {4}), kInvalid);
  EXPECT_EQ(code(4, {-1, 2}), kInvalid);
  EXPECT_EQ(code(4, {1, 1}), kInvalid);
  EXPECT_EQ(code(4, {2, 1}), kInvalid);
  EXPECT_EQ(LocalShards::Create(4, {2, 1}).status().message(),
            "local shards: positions must be increasing, got 1 after 2");
  auto ok = LocalShards::Create(4, {1, 3});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->gang_size(), 4);
  EXPECT_EQ(ok->num_local(), 2);
  EXPECT_FALSE(ok->whole_gang());
  EXPECT_TRUE(MustLocalShards(2, {0, 1}).whole_gang());
  EXPECT_TRUE(MustLocalShards(static_cast<int>(kMaxAxisSize), {0}).positions()[0] == 0);
}

// A partial gang's scratch holds the local shards' scratch, then the
// largest cross-shard op's gathered operand and result over the whole gang.
TEST(FunctionExecutableRunLocalTest, LocalScratchCoversTheGangTemporaries) {
  auto exe = MustCompile(AllGatherFunction(4));  // largest: f32[2,3] in, f32[2,3,4] out
  ASSERT_NE(exe, nullptr);
  // Per gang shard: the operand's 24 bytes and the result's 96, each
  // rounded up to 64-byte pieces.
  EXPECT_EQ(exe->local_scratch_bytes(2, 4), exe->scratch_bytes(2) + (64 + 128) * 4);
}

// A float psum on a partial gang adds each host's shards in gang order,
// then the hosts' sums (here the test gang's host order): exactly
// (x0 + x2) + (x1 + x3) for hosts {0, 2} and {1, 3}, which differs from
// Run()'s ((x0 + x1) + x2) + x3 in its last bits for these values.
TEST(FunctionExecutableRunLocalTest, PsumReducesLocalShardsThenHosts) {
  FunctionBuilder b("psum_f32", "i");
  ASSERT_TRUE(b.SetAxisSize(4).ok());
  const int32_t x = b.Parameter(DType::kF32, {});
  auto px = b.Psum(x, "i");
  ASSERT_TRUE(px.ok()) << px.status();
  auto exe = MustCompile(b.Build({*px}));
  ASSERT_NE(exe, nullptr);
  const std::vector<float> xs = {1.0f, 1e8f, 3.0f, -1e8f};
  const std::vector<std::vector<uint8_t>> inputs = {Bytes(xs)};
  const float whole = Values<float>(RunGang(*exe, 4, inputs)[0])[0];
  const float hierarchical = (xs[0] + xs[2]) + (xs[1] + xs[3]);
  ASSERT_NE(whole, hierarchical);  // the values make the order visible
  ThreadedGang gang({{0, 2}, {1, 3}});
  std::deque<HostRun> hosts;
  hosts.emplace_back(*exe, MustLocalShards(4, {0, 2}), inputs);
  hosts.emplace_back(*exe, MustLocalShards(4, {1, 3}), inputs);
  std::thread other([&] { hosts[1].Run(*exe, gang.collectives(1)); });
  hosts[0].Run(*exe, gang.collectives(0));
  other.join();
  for (HostRun& host : hosts) {
    ASSERT_TRUE(host.status.ok()) << host.status;
    EXPECT_EQ(Values<float>(host.outputs[0]), std::vector<float>(2, hierarchical));
  }
  EXPECT_EQ(gang.calls(0), 1);
  EXPECT_EQ(gang.reduce_calls(0), 1);
}

// first_collective(): what a partial gang's first call to its collectives
// is (a host that cannot run makes just that call), and RunLocal's first
// call is indeed that one.
TEST(FunctionExecutableRunLocalTest, FirstCollectiveIsRunLocalsFirstCall) {
  using Kind = FunctionExecutable::CollectiveCall::Kind;
  struct Case {
    IrOr (*trace)(int gang);
    Kind kind;
    DType dtype;
    ReduceOp op;
    int64_t size;  // count or shard_bytes
  };
  const Case cases[] = {
      {PsumFunction, Kind::kAllReduce, DType::kF32, ReduceOp::kSum, 6},
      {PmeanPmaxPminFunction, Kind::kAllReduce, DType::kF64, ReduceOp::kSum, 4},  // pmean's float64 sums
      {AllGatherFunction, Kind::kAllGather, DType::kF32, ReduceOp::kSum, 24},
      {MixedFunction, Kind::kAllReduce, DType::kF32, ReduceOp::kSum, 40 * 8},
      {AxisIndexFunction, Kind::kNone, DType::kF32, ReduceOp::kSum, 0},
      {ConstantCollectivesFunction, Kind::kNone, DType::kF32, ReduceOp::kSum, 0},
      // Its first loop's cond calls nothing; the hosts agree to go on.
      {WhileGangFunction, Kind::kAllReduce, DType::kBool, ReduceOp::kMax, 1},
  };
  for (const Case& c : cases) {
    auto exe = MustCompile(c.trace(4));
    ASSERT_NE(exe, nullptr);
    SCOPED_TRACE(exe->ir().name());
    const FunctionExecutable::CollectiveCall& call = exe->first_collective();
    EXPECT_EQ(call.kind, c.kind);
    if (c.kind == Kind::kAllReduce) {
      EXPECT_EQ(call.dtype, c.dtype);
      EXPECT_EQ(call.op, c.op);
      EXPECT_EQ(call.count, c.size);
    } else if (c.kind == Kind::kAllGather) {
      EXPECT_EQ(call.shard_bytes, c.size);
    }
    // RunLocal's first call, seen by a recorder that then fails the run.
    struct Recorder : GangCollectives {
      absl::Status AllGather(const void*, void*, int64_t shard_bytes) override {
        if (calls++ == 0) first = {Kind::kAllGather, shard_bytes};
        return absl::CancelledError("recorded");
      }
      absl::Status AllReduce(DType dtype, ReduceOp op, void*, int64_t count) override {
        if (calls++ == 0) first = {Kind::kAllReduce, 0, dtype, op, count};
        return absl::CancelledError("recorded");
      }
      int calls = 0;
      FunctionExecutable::CollectiveCall first;
    } recorder;
    HostRun host(*exe, MustLocalShards(4, {1, 2}), GangInputs(*exe, 4));
    host.Run(*exe, &recorder);
    EXPECT_EQ(recorder.calls, c.kind == Kind::kNone ? 0 : 1);
    EXPECT_EQ(recorder.first.kind, call.kind);
    EXPECT_EQ(recorder.first.shard_bytes, call.shard_bytes);
    EXPECT_EQ(recorder.first.dtype, call.dtype);
    EXPECT_EQ(recorder.first.op, call.op);
    EXPECT_EQ(recorder.first.count, call.count);
  }
  // psum of bool counts (the builder converts to int32 first): an int32 sum.
  FunctionBuilder b("psum_bool", "i");
  const int32_t q = b.Parameter(DType::kBool, {3});
  auto pq = b.Psum(q, "i");
  ASSERT_TRUE(pq.ok()) << pq.status();
  auto exe = MustCompile(b.Build({*pq}));
  ASSERT_NE(exe, nullptr);
  EXPECT_EQ(exe->first_collective().kind, Kind::kAllReduce);
  EXPECT_EQ(exe->first_collective().dtype, DType::kI32);
  EXPECT_EQ(exe->first_collective().op, ReduceOp::kSum);
}


// --- Loops (kScan) -------------------------------------------------------------

// dot(c: f64[], x: f64[3], w: f64[3]) -> (c + sum(x * w), x * c, c)
std::shared_ptr<const FunctionIr> DotScanBody() {
  FunctionBuilder b("dot", "");
  const int32_t c = b.Parameter(DType::kF64, {});
  const int32_t x = b.Parameter(DType::kF64, {3});
  const int32_t w = b.Parameter(DType::kF64, {3});
  const int32_t xw = *b.Binary(OpKind::kMul, x, w);
  const int32_t next = *b.Binary(OpKind::kAdd, c, *b.Reduce(ReduceKind::kSum, xw, nullptr, false));
  auto ir = b.Build({next, *b.Binary(OpKind::kMul, x, c), c});
  EXPECT_TRUE(ir.ok()) << ir.status();
  return *ir;
}

// A scan of DotScanBody over `length` rows gives, on every shard, what a
// loop in C++ gives (forwards and reversed), and allocates nothing.
TEST(FunctionExecutableScanTest, MatchesALoop) {
  for (int shards : kShardCounts) {
    for (int64_t length : {0, 1, 5}) {
      for (bool reverse : {false, true}) {
        SCOPED_TRACE(testing::Message() << "shards=" << shards << " length=" << length
                                        << " reverse=" << reverse);
        FunctionBuilder b("f", "");
        const int32_t c = b.Parameter(DType::kF64, {});
        const int32_t xs = b.Parameter(DType::kF64, {length, 3});
        const int32_t w = b.Parameter(DType::kF64, {3});
        auto r = b.ScanResults(DotScanBody(), {c, xs, w}, 1, 1, length, reverse);
        ASSERT_TRUE(r.ok()) << r.status();
        auto exe = MustCompile(b.Build(*r));
        ASSERT_NE(exe, nullptr);
        const auto c0 = Iota<double>(shards, 1, 0.5, 1.0);
        const auto x = Iota<double>(shards, length * 3, -1.0, 0.25);
        const auto wv = Iota<double>(shards, 3, 2.0, -0.5);
        int64_t allocations = -1;
        const auto out = RunGang(*exe, shards, {Bytes(c0), Bytes(x), Bytes(wv)}, &allocations);
        EXPECT_EQ(allocations, 0);
        const auto carry = Values<double>(out[0]);
        const auto ys = Values<double>(out[1]);
        const auto cs = Values<double>(out[2]);
        for (int s = 0; s < shards; ++s) {
          double acc = c0[s];
          std::vector<double> want_ys(length * 3), want_cs(length);
          for (int64_t it = 0; it < length; ++it) {
            const int64_t i = reverse ? length - 1 - it : it;
            double dot = 0;
            for (int j = 0; j < 3; ++j) {
              const double xj = x[(s * length + i) * 3 + j];
              dot += xj * wv[s * 3 + j];
              want_ys[i * 3 + j] = xj * acc;
            }
            want_cs[i] = acc;
            acc += dot;
          }
          EXPECT_NEAR(carry[s], acc, 1e-12 * std::abs(acc));
          for (int64_t j = 0; j < length * 3; ++j) {
            EXPECT_NEAR(ys[s * length * 3 + j], want_ys[j], 1e-12 * std::abs(want_ys[j])) << s << " " << j;
          }
          for (int64_t i = 0; i < length; ++i) EXPECT_EQ(cs[s * length + i], want_cs[i]);
        }
      }
    }
  }
}

// The scratch of a loop does not grow with its length: only its stacked ys
// do (here there are none).
TEST(FunctionExecutableScanTest, ScratchDoesNotGrowWithTheLength) {
  FunctionBuilder body("inc", "");
  const int32_t c = body.Parameter(DType::kF32, {64});
  const int32_t one = ScalarConstant(body, 1.0f);
  auto body_fn = body.Build({*body.Binary(OpKind::kAdd, c, one)});
  ASSERT_TRUE(body_fn.ok());
  std::vector<int64_t> bytes;
  for (int64_t length : {2, 200}) {
    FunctionBuilder b("f", "");
    const int32_t x = b.Parameter(DType::kF32, {64});
    auto r = b.ScanResults(*body_fn, {x}, 1, 0, length, false);
    ASSERT_TRUE(r.ok());
    auto exe = MustCompile(b.Build(*r));
    ASSERT_NE(exe, nullptr);
    bytes.push_back(exe->scratch_bytes(4));
    const auto out = RunGang(*exe, 4, {Bytes(Iota<float>(4, 64, 0, 1))});
    EXPECT_EQ(Values<float>(out[0]), Iota<float>(4, 64, static_cast<float>(length), 1));
  }
  EXPECT_EQ(bytes[0], bytes[1]);
}

// A carry passed through, an x returned as the next carry, and a carry
// returned as a y: the body's outputs that are its parameters are copied.
TEST(FunctionExecutableScanTest, BodyOutputsThatAreParameters) {
  FunctionBuilder body("swap", "");
  const int32_t a = body.Parameter(DType::kI32, {2});
  const int32_t keep = body.Parameter(DType::kBool, {});
  const int32_t x = body.Parameter(DType::kI32, {2});
  auto body_fn = body.Build({x, keep, a, a});
  ASSERT_TRUE(body_fn.ok());
  for (int shards : kShardCounts) {
    SCOPED_TRACE(shards);
    FunctionBuilder b("f", "");
    const int32_t a0 = b.Parameter(DType::kI32, {2});
    const int32_t k0 = b.Parameter(DType::kBool, {});
    const int32_t xs = b.Parameter(DType::kI32, {3, 2});
    auto r = b.ScanResults(*body_fn, {a0, k0, xs}, 2, 1, 3, false);
    ASSERT_TRUE(r.ok()) << r.status();
    auto exe = MustCompile(b.Build(*r));
    ASSERT_NE(exe, nullptr);
    const auto av = Iota<int32_t>(shards, 2, 100, 1);
    std::vector<uint8_t> keeps(shards);
    for (int s = 0; s < shards; ++s) keeps[s] = s % 2;
    const auto xv = Iota<int32_t>(shards, 6, 0, 1);
    const auto out = RunGang(*exe, shards, {Bytes(av), keeps, Bytes(xv)});
    const auto last = Values<int32_t>(out[0]);
    const auto ys0 = Values<int32_t>(out[2]);
    for (int s = 0; s < shards; ++s) {
      // The carry after 3 steps is row 2; the ys are the carry before each
      // step: a0, then rows 0 and 1.
      EXPECT_EQ(last[s * 2], xv[s * 6 + 4]);
      EXPECT_EQ(last[s * 2 + 1], xv[s * 6 + 5]);
      EXPECT_EQ(out[1][s], keeps[s]);
      const std::vector<int32_t> want = {av[s * 2], av[s * 2 + 1], xv[s * 6], xv[s * 6 + 1],
                                         xv[s * 6 + 2], xv[s * 6 + 3]};
      EXPECT_EQ(std::vector<int32_t>(ys0.begin() + s * 6, ys0.begin() + s * 6 + 6), want);
      EXPECT_EQ(Values<int32_t>(out[3]), Values<int32_t>(out[2]));
    }
  }
}

// A psum in a loop's body: every iteration reduces over the whole gang.
// c_{t+1} = c_t + psum(c_t), so the gang's total multiplies by (1 + n) each
// step and every shard adds the same amount.
// step(c: f64[]) -> c + psum(c), over axis "i" of `shards`.
absl::StatusOr<std::shared_ptr<const FunctionIr>> PsumStepBody(int shards) {
  FunctionBuilder body("step", "i");
  PW_RETURN_IF_ERROR(body.SetAxisSize(shards));
  const int32_t c = body.Parameter(DType::kF64, {});
  PW_ASSIGN_OR_RETURN(const int32_t total, body.Psum(c, "i"));
  PW_ASSIGN_OR_RETURN(const int32_t next, body.Binary(OpKind::kAdd, c, total));
  return body.Build({next});
}

TEST(FunctionExecutableScanTest, PsumInTheBody) {
  for (int shards : kShardCounts) {
    SCOPED_TRACE(shards);
    auto body_fn = PsumStepBody(shards);
    ASSERT_TRUE(body_fn.ok()) << body_fn.status();
    FunctionBuilder b("f", "i");
    ASSERT_TRUE(b.SetAxisSize(shards).ok());
    const int32_t x = b.Parameter(DType::kF64, {});
    auto r = b.ScanResults(*body_fn, {x}, 1, 0, 4, false);
    ASSERT_TRUE(r.ok()) << r.status();
    auto exe = MustCompile(b.Build(*r));
    ASSERT_NE(exe, nullptr);
    std::vector<double> cs = Iota<double>(shards, 1, 1.0, 1.0);
    const auto out = Values<double>(RunGang(*exe, shards, {Bytes(cs)})[0]);
    for (int t = 0; t < 4; ++t) {
      double total = 0;
      for (double v : cs) total += v;
      for (double& v : cs) v += total;
    }
    EXPECT_EQ(out, cs);
  }
}

// --- While loops (kWhile) --------------------------------------------------------

// collatz(n: i32[], steps: i32[], cap: i32[]) -> (n even ? n / 2 : 3n + 1,
// steps + 1) while n != 1 and steps < cap: each shard its own trip count.
absl::StatusOr<std::shared_ptr<const FunctionIr>> CollatzFunction() {
  FunctionBuilder cond("not_one", "");
  const int32_t cn = cond.Parameter(DType::kI32, {});
  const int32_t cs = cond.Parameter(DType::kI32, {});
  const int32_t cap = cond.Parameter(DType::kI32, {});
  const int32_t one = ScalarConstant(cond, int32_t{1});
  PW_ASSIGN_OR_RETURN(const int32_t ne, cond.Binary(OpKind::kNe, cn, one));
  PW_ASSIGN_OR_RETURN(const int32_t lt, cond.Binary(OpKind::kLt, cs, cap));
  PW_ASSIGN_OR_RETURN(auto cond_fn, cond.Build({*cond.Binary(OpKind::kAnd, ne, lt)}));
  FunctionBuilder body("step", "");
  const int32_t bn = body.Parameter(DType::kI32, {});
  const int32_t bs = body.Parameter(DType::kI32, {});
  body.Parameter(DType::kI32, {});
  const int32_t two = ScalarConstant(body, int32_t{2});
  const int32_t three = ScalarConstant(body, int32_t{3});
  const int32_t bone = ScalarConstant(body, int32_t{1});
  PW_ASSIGN_OR_RETURN(const int32_t odd, body.Binary(OpKind::kRem, bn, two));
  PW_ASSIGN_OR_RETURN(const int32_t is_odd, body.Binary(OpKind::kEq, odd, bone));
  PW_ASSIGN_OR_RETURN(const int32_t halved, body.Binary(OpKind::kShiftRightArithmetic, bn, bone));
  PW_ASSIGN_OR_RETURN(const int32_t tripled,
                      body.Binary(OpKind::kAdd, *body.Binary(OpKind::kMul, bn, three), bone));
  PW_ASSIGN_OR_RETURN(const int32_t next, body.Select(is_odd, tripled, halved));
  PW_ASSIGN_OR_RETURN(auto body_fn, body.Build({next, *body.Binary(OpKind::kAdd, bs, bone)}));
  FunctionBuilder b("collatz", "");
  const int32_t n0 = b.Parameter(DType::kI32, {});
  const int32_t cap0 = b.Parameter(DType::kI32, {});
  const int32_t zero = ScalarConstant(b, int32_t{0});
  PW_ASSIGN_OR_RETURN(auto r, b.WhileResults(cond_fn, body_fn, {n0, zero, cap0}, 2));
  return b.Build(r);
}

// Each shard runs its own, data-dependent trip count (zero for n = 1 or a
// cap of 0), as a loop in C++ does; nothing allocates.
TEST(FunctionExecutableWhileTest, MatchesALoopPerShard) {
  auto exe = MustCompile(CollatzFunction());
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(shards);
    std::vector<int32_t> n(shards), cap(shards);
    for (int s = 0; s < shards; ++s) {
      n[s] = std::vector<int32_t>{1, 27, 6, 7, 97, 2, 1000, 871}[s % 8];
      cap[s] = s == 2 ? 0 : (s == 5 ? 3 : 1000);
    }
    int64_t allocations = -1;
    const auto out = RunGang(*exe, shards, {Bytes(n), Bytes(cap)}, &allocations);
    EXPECT_EQ(allocations, 0);
    const auto got_n = Values<int32_t>(out[0]);
    const auto got_steps = Values<int32_t>(out[1]);
    for (int s = 0; s < shards; ++s) {
      int32_t v = n[s];
      int32_t steps = 0;
      while (v != 1 && steps < cap[s]) {
        v = v % 2 == 1 ? 3 * v + 1 : v / 2;
        ++steps;
      }
      EXPECT_EQ(got_n[s], v) << s;
      EXPECT_EQ(got_steps[s], steps) << s;
    }
  }
}

// A carry the body passes through, a const returned as a carry, and a cond
// that is a carry itself: outputs that are parameters are copied.
TEST(FunctionExecutableWhileTest, OutputsThatAreParameters) {
  FunctionBuilder cond("go", "");
  const int32_t go = cond.Parameter(DType::kBool, {});
  cond.Parameter(DType::kF32, {3});
  cond.Parameter(DType::kF32, {3});
  auto cond_fn = cond.Build({go});
  ASSERT_TRUE(cond_fn.ok());
  FunctionBuilder body("once", "");
  body.Parameter(DType::kBool, {});
  body.Parameter(DType::kF32, {3});
  const int32_t w = body.Parameter(DType::kF32, {3});
  const int32_t no = *body.Constant(DType::kBool, {}, {0});
  auto body_fn = body.Build({no, w});
  ASSERT_TRUE(body_fn.ok());
  FunctionBuilder b("f", "");
  const int32_t go0 = b.Parameter(DType::kBool, {});
  const int32_t x0 = b.Parameter(DType::kF32, {3});
  const int32_t w0 = b.Parameter(DType::kF32, {3});
  auto r = b.WhileResults(*cond_fn, *body_fn, {go0, x0, w0}, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  auto exe = MustCompile(b.Build(*r));
  ASSERT_NE(exe, nullptr);
  for (int shards : kShardCounts) {
    SCOPED_TRACE(shards);
    std::vector<uint8_t> gos(shards);
    for (int s = 0; s < shards; ++s) gos[s] = s % 2;
    const auto x = Iota<float>(shards, 3, 0, 1);
    const auto wv = Iota<float>(shards, 3, 100, -1);
    const auto out = RunGang(*exe, shards, {gos, Bytes(x), Bytes(wv)});
    const auto got = Values<float>(out[1]);
    for (int s = 0; s < shards; ++s) {
      EXPECT_EQ(out[0][s], 0);
      for (int j = 0; j < 3; ++j) EXPECT_EQ(got[s * 3 + j], (s % 2 ? wv : x)[s * 3 + j]);
    }
  }
}

// A psum in a while's body: every iteration reduces over the whole gang.
// c_{t+1} = c_t + psum(c_t) while the gang's total (a psum in the cond) is
// below a bound: the count is the gang's, the same on every shard.
TEST(FunctionExecutableWhileTest, PsumInTheBodyAndCond) {
  for (int shards : kShardCounts) {
    SCOPED_TRACE(shards);
    FunctionBuilder cond("small", "i");
    ASSERT_TRUE(cond.SetAxisSize(shards).ok());
    const int32_t cc = cond.Parameter(DType::kF64, {});
    const int32_t bound = ScalarConstant(cond, 1000.0);
    auto cond_fn = cond.Build({*cond.Binary(OpKind::kLt, *cond.Psum(cc, "i"), bound)});
    ASSERT_TRUE(cond_fn.ok());
    auto body_fn = PsumStepBody(shards);
    ASSERT_TRUE(body_fn.ok()) << body_fn.status();
    FunctionBuilder b("f", "i");
    ASSERT_TRUE(b.SetAxisSize(shards).ok());
    const int32_t x = b.Parameter(DType::kF64, {});
    auto r = b.WhileResults(*cond_fn, *body_fn, {x}, 1);
    ASSERT_TRUE(r.ok()) << r.status();
    auto exe = MustCompile(b.Build(*r));
    ASSERT_NE(exe, nullptr);
    std::vector<double> cs = Iota<double>(shards, 1, 1.0, 1.0);
    int64_t allocations = -1;
    const auto out = Values<double>(RunGang(*exe, shards, {Bytes(cs)}, &allocations)[0]);
    EXPECT_EQ(allocations, 0);
    int trips = 0;
    for (;;) {
      double total = 0;
      for (double v : cs) total += v;
      if (!(total < 1000.0)) break;
      for (double& v : cs) v += total;
      ++trips;
    }
    EXPECT_GT(trips, 1);
    EXPECT_EQ(out, cs);
  }
}

}  // namespace
}  // namespace pw
