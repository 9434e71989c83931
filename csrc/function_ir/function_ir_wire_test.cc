#include "csrc/function_ir/function_ir_wire.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "csrc/kernels/function_executable.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The value of a builder call that must succeed (0, a valid value, if not:
// the test has failed and goes on without crashing).
int32_t Ok(const absl::StatusOr<int32_t>& v) {
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : 0;
}

std::shared_ptr<const FunctionIr> MustBuild(FunctionBuilder& b, std::vector<int32_t> outputs) {
  auto ir = b.Build(outputs);
  EXPECT_TRUE(ir.ok()) << ir.status();
  return ir.ok() ? *ir : nullptr;
}

// Elementwise ops, constants of every dtype, converts (explicit, inserted
// by promotion, and folded into constants) and simulated compute.
std::shared_ptr<const FunctionIr> ElementwiseFunction() {
  FunctionBuilder b("elementwise", "");
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  const int32_t k = b.Parameter(DType::kI32, {3});
  const int32_t p = b.Parameter(DType::kBool, {2, 3});
  const int32_t d = b.Parameter(DType::kF64, {});
  const int32_t c32 = Ok(b.Constant(DType::kF32, {3}, Bytes<float>({1.5f, -2, 0.25f})));
  const int32_t c64 = Ok(b.Constant(DType::kF64, {2, 3}, Bytes<double>({0.1, 2, 3, 4, 5, 6})));
  const int32_t ci = Ok(b.Constant(DType::kI32, {}, Bytes<int32_t>({7})));
  const int32_t cb = Ok(b.Constant(DType::kBool, {3}, std::vector<uint8_t>{1, 0, 1}));
  std::vector<int32_t> outs;
  for (OpKind kind : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kPow,
                      OpKind::kRem, OpKind::kAtan2, OpKind::kMax, OpKind::kMin}) {
    outs.push_back(Ok(b.Binary(kind, x, c32)));
    outs.push_back(Ok(b.Binary(kind, k, ci)));  // div of int32: converts to f64
  }
  outs.push_back(Ok(b.Binary(OpKind::kAdd, ci, x)));  // int32 constant folded to f64
  outs.push_back(Ok(b.Binary(OpKind::kMul, c64, d)));
  for (OpKind kind :
       {OpKind::kEq, OpKind::kNe, OpKind::kLt, OpKind::kLe, OpKind::kGt, OpKind::kGe}) {
    outs.push_back(Ok(b.Binary(kind, x, k)));
  }
  for (OpKind kind : {OpKind::kAnd, OpKind::kOr, OpKind::kXor}) {
    outs.push_back(Ok(b.Binary(kind, p, cb)));
  }
  for (OpKind kind : {OpKind::kNeg, OpKind::kAbs, OpKind::kExp, OpKind::kLog, OpKind::kTanh,
                      OpKind::kSqrt, OpKind::kRsqrt, OpKind::kSin, OpKind::kCos, OpKind::kErf,
                      OpKind::kErfc, OpKind::kTan, OpKind::kAsin, OpKind::kAcos, OpKind::kAtan,
                      OpKind::kSinh, OpKind::kCosh, OpKind::kAsinh, OpKind::kAcosh,
                      OpKind::kAtanh}) {
    outs.push_back(Ok(b.Unary(kind, x)));
  }
  outs.push_back(Ok(b.Unary(OpKind::kExp, k)));  // int32 -> f64
  outs.push_back(Ok(b.Unary(OpKind::kNot, p)));
  outs.push_back(Ok(b.Select(p, x, k)));
  outs.push_back(Ok(b.Convert(x, DType::kI32)));
  outs.push_back(Ok(b.Convert(p, DType::kF64)));
  // uint32: constants, bitwise ops and shifts (with int32: promoted), bitcasts.
  const int32_t u = b.Parameter(DType::kU32, {3});
  const int32_t cu = Ok(b.Constant(DType::kU32, {3}, Bytes<uint32_t>({1, 0x80000000u, 33})));
  for (OpKind kind : {OpKind::kAnd, OpKind::kOr, OpKind::kXor, OpKind::kShiftLeft,
                      OpKind::kShiftRightLogical, OpKind::kShiftRightArithmetic}) {
    outs.push_back(Ok(b.Binary(kind, u, cu)));
    outs.push_back(Ok(b.Binary(kind, k, u)));
  }
  outs.push_back(Ok(b.Unary(OpKind::kNot, u)));
  outs.push_back(Ok(b.Unary(OpKind::kNot, k)));
  outs.push_back(Ok(b.Convert(u, DType::kF32)));
  outs.push_back(Ok(b.Convert(Ok(b.Convert(c64, DType::kU32)), DType::kF64)));  // folded
  outs.push_back(Ok(b.BitcastConvert(u, DType::kF32)));
  outs.push_back(Ok(b.BitcastConvert(x, DType::kI32)));
  outs.push_back(Ok(b.Copy(x)));
  const int32_t slow = Ok(b.SimulatedCompute(x, 1500));
  outs.push_back(Ok(b.SimulatedComputeMicros(slow, 2.25)));
  outs.push_back(x);  // a parameter as an output, twice
  outs.push_back(x);
  return MustBuild(b, outs);
}

// Every collective, over `n` shards.
std::shared_ptr<const FunctionIr> CollectiveFunction(int n) {
  FunctionBuilder b("collectives", "i");
  EXPECT_TRUE(b.SetAxisSize(n).ok());
  const int32_t x = b.Parameter(DType::kF32, {2, 3 * n});
  const int32_t k = b.Parameter(DType::kI32, {n, 2});
  const int32_t p = b.Parameter(DType::kBool, {2});
  const int32_t votes = b.Parameter(DType::kBool, {2, n});
  std::vector<int32_t> outs;
  outs.push_back(Ok(b.Psum(x, "i")));
  outs.push_back(Ok(b.Psum(p, "i")));  // bool: converted to int32
  outs.push_back(Ok(b.Pcollective(OpKind::kPmean, k, "i")));
  outs.push_back(Ok(b.Pcollective(OpKind::kPmax, x, "i")));
  outs.push_back(Ok(b.Pcollective(OpKind::kPmin, k, "i")));
  outs.push_back(Ok(b.AxisIndex("i")));
  outs.push_back(Ok(b.AllGather(x, "i", -1)));
  outs.push_back(Ok(b.AllGather(k, "i", 0)));
  // A cycle (all shards send) and a single pair (the others receive zeros).
  std::vector<std::pair<int64_t, int64_t>> cycle;
  for (int s = 0; s < n; ++s) cycle.emplace_back(s, (s + 1) % n);
  outs.push_back(Ok(b.Ppermute(x, "i", cycle)));
  outs.push_back(Ok(b.Ppermute(k, "i", {{0, n - 1}})));
  outs.push_back(Ok(b.AllToAll(x, "i", 1, 0)));
  outs.push_back(Ok(b.PsumScatter(k, "i", 0)));
  outs.push_back(Ok(b.PsumScatter(votes, "i", -1)));  // bool: converted to int32
  return MustBuild(b, outs);
}

// bfloat16 over `n` shards: parameters and constants, the ops the builder
// computes in float32 (its converts travel as ops of their own) and those
// that move bfloat16 as it is.
std::shared_ptr<const FunctionIr> BFloat16Function(int n) {
  FunctionBuilder b("bfloat16", "i");
  EXPECT_TRUE(b.SetAxisSize(n).ok());
  const int32_t h = b.Parameter(DType::kBF16, {2, n});
  const int32_t k = b.Parameter(DType::kI32, {2, n});
  const int32_t x = b.Parameter(DType::kF32, {n});
  const int32_t p = b.Parameter(DType::kBool, {2, n});
  // 1.5, -0.1 (rounded), NaN, 65280 (the largest below 2^16).
  const int32_t c = Ok(b.Constant(DType::kBF16, {4},
                                  Bytes<uint16_t>({0x3fc0, 0xbdcd, 0x7fc0, 0x477f})));
  const int32_t row = Ok(b.Reshape(c, {1, 4}));
  std::vector<int32_t> outs;
  for (OpKind kind : {OpKind::kAdd, OpKind::kDiv, OpKind::kPow, OpKind::kMax, OpKind::kLt}) {
    outs.push_back(Ok(b.Binary(kind, h, k)));  // int32 rounds to bf16 first
  }
  outs.push_back(Ok(b.Binary(OpKind::kMul, h, x)));  // f32
  outs.push_back(Ok(b.Unary(OpKind::kExp, h)));
  outs.push_back(Ok(b.Unary(OpKind::kNeg, h)));
  outs.push_back(Ok(b.Select(p, h, k)));
  outs.push_back(Ok(b.Convert(k, DType::kBF16)));
  outs.push_back(Ok(b.Convert(c, DType::kI32)));  // folded
  const std::vector<int64_t> last = {-1};
  outs.push_back(Ok(b.Reduce(ReduceKind::kSum, h, nullptr, false)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kMean, h, &last, true)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kArgmax, h, &last, false)));
  outs.push_back(Ok(b.Matmul(Ok(b.Reshape(h, {2 * n, 1})), row)));
  const int32_t idx = Ok(b.Constant(DType::kI32, {3}, Bytes<int32_t>({1, 0, 1})));
  const int32_t take = Ok(b.Take(h, idx, 0));
  outs.push_back(take);
  outs.push_back(Ok(b.ScatterAdd(take, idx, 0, 2)));
  outs.push_back(Ok(b.TopK(h, 1)));
  outs.push_back(Ok(b.Concatenate(std::vector<int32_t>{h, k}, 0)));
  outs.push_back(Ok(b.Pad(h, {1, 0}, {0, 1}, {0, 1})));
  outs.push_back(Ok(b.Transpose(h, {1, 0})));
  outs.push_back(Ok(b.Psum(h, "i")));
  outs.push_back(Ok(b.Pcollective(OpKind::kPmean, h, "i")));
  outs.push_back(Ok(b.Pcollective(OpKind::kPmax, h, "i")));
  outs.push_back(Ok(b.AllGather(h, "i", 0)));
  outs.push_back(Ok(b.Ppermute(h, "i", {{0, n - 1}})));
  outs.push_back(Ok(b.AllToAll(h, "i", 1, 0)));
  outs.push_back(Ok(b.PsumScatter(h, "i", 1)));
  outs.push_back(Ok(b.SimulatedCompute(h, 1000)));
  outs.push_back(c);
  return MustBuild(b, outs);
}

// Loops over `n` shards: a scan with a carry, xs and a const; a reversed
// scan whose body holds another scan and a psum; a length-0 scan; and the
// get_elements of their tuples.
std::shared_ptr<const FunctionIr> ScanFunction(int n) {
  // dot(c: f32[], x: f32[3], w: f32[3]) -> (c + sum(x * w), x * c)
  FunctionBuilder dot("dot", "");
  const int32_t dc = dot.Parameter(DType::kF32, {});
  const int32_t dx = dot.Parameter(DType::kF32, {3});
  const int32_t dw = dot.Parameter(DType::kF32, {3});
  const int32_t dxw = Ok(dot.Binary(OpKind::kMul, dx, dw));
  const int32_t dnext = Ok(dot.Binary(OpKind::kAdd, dc, Ok(dot.Reduce(ReduceKind::kSum, dxw, nullptr, false))));
  auto dot_fn = MustBuild(dot, {dnext, Ok(dot.Binary(OpKind::kMul, dx, dc))});
  // inner(acc: i32[], e: f32[]) -> (acc + 1, e * 2)
  FunctionBuilder inner("inner", "");
  const int32_t acc = inner.Parameter(DType::kI32, {});
  const int32_t e = inner.Parameter(DType::kF32, {});
  const int32_t one = Ok(inner.Constant(DType::kI32, {}, Bytes<int32_t>({1})));
  const int32_t two = Ok(inner.Constant(DType::kF32, {}, Bytes<float>({2})));
  auto inner_fn = MustBuild(inner, {Ok(inner.Binary(OpKind::kAdd, acc, one)),
                                    Ok(inner.Binary(OpKind::kMul, e, two))});
  // outer(k: i32[], x: f32[3]) -> (k', psum(inner's ys)), over axis "i"
  FunctionBuilder outer("outer", "i");
  EXPECT_TRUE(outer.SetAxisSize(n).ok());
  const int32_t ok = outer.Parameter(DType::kI32, {});
  const int32_t ox = outer.Parameter(DType::kF32, {3});
  auto in = outer.ScanResults(inner_fn, {ok, ox}, 1, 1, 3, false);
  EXPECT_TRUE(in.ok()) << in.status();
  auto outer_fn = MustBuild(outer, {(*in)[0], Ok(outer.Psum((*in)[1], "i"))});

  FunctionBuilder b("loops", "i");
  EXPECT_TRUE(b.SetAxisSize(n).ok());
  const int32_t c = b.Parameter(DType::kF32, {});
  const int32_t xs = b.Parameter(DType::kF32, {4, 3});
  const int32_t w = b.Parameter(DType::kF32, {3});
  const int32_t k = b.Parameter(DType::kI32, {});
  std::vector<int32_t> outs;
  auto first = b.ScanResults(dot_fn, {c, xs, w}, 1, 1, 4, false);
  EXPECT_TRUE(first.ok()) << first.status();
  outs.insert(outs.end(), first->begin(), first->end());
  auto second = b.ScanResults(outer_fn, {k, xs}, 1, 1, 4, true);
  EXPECT_TRUE(second.ok()) << second.status();
  outs.insert(outs.end(), second->begin(), second->end());
  const int32_t none = Ok(b.Slice(xs, {0, 0}, {0, 3}, {1, 1}));  // f32[0,3]
  auto empty = b.ScanResults(dot_fn, {c, none, w}, 1, 1, 0, false);
  EXPECT_TRUE(empty.ok()) << empty.status();
  outs.insert(outs.end(), empty->begin(), empty->end());
  return MustBuild(b, outs);
}

// A while loop over `n` shards whose trip count the data decides, bounded
// whatever the inputs (at most 6 iterations): its cond psums a carry (a
// collective in a cond), its body runs a scan, and a carry starts as a
// constant.
std::shared_ptr<const FunctionIr> WhileFunction(int n) {
  // less(c: f32[], k: i32[], x: f32[3]) -> k < 6 & psum(c) < sum(x)
  FunctionBuilder cond("less", "i");
  EXPECT_TRUE(cond.SetAxisSize(n).ok());
  const int32_t cc = cond.Parameter(DType::kF32, {});
  const int32_t ck = cond.Parameter(DType::kI32, {});
  const int32_t cx = cond.Parameter(DType::kF32, {3});
  const int32_t six = Ok(cond.Constant(DType::kI32, {}, Bytes<int32_t>({6})));
  const int32_t bounded = Ok(cond.Binary(OpKind::kLt, ck, six));
  const int32_t below = Ok(cond.Binary(OpKind::kLt, Ok(cond.Psum(cc, "i")),
                                       Ok(cond.Reduce(ReduceKind::kSum, cx, nullptr, false))));
  auto cond_fn = MustBuild(cond, {Ok(cond.Binary(OpKind::kAnd, bounded, below))});
  // step(a: f32[], e: f32[]) -> (a + e)
  FunctionBuilder step("step", "");
  const int32_t sa = step.Parameter(DType::kF32, {});
  const int32_t se = step.Parameter(DType::kF32, {});
  auto step_fn = MustBuild(step, {Ok(step.Binary(OpKind::kAdd, sa, se))});
  // grow(c: f32[], k: i32[], x: f32[3]) -> (scan(step, c, x), k + 1)
  FunctionBuilder body("grow", "");
  const int32_t bc = body.Parameter(DType::kF32, {});
  const int32_t bk = body.Parameter(DType::kI32, {});
  const int32_t bx = body.Parameter(DType::kF32, {3});
  auto scanned = body.ScanResults(step_fn, {bc, bx}, 1, 1, 3, false);
  EXPECT_TRUE(scanned.ok()) << scanned.status();
  const int32_t one = Ok(body.Constant(DType::kI32, {}, Bytes<int32_t>({1})));
  auto body_fn = MustBuild(body, {(*scanned)[0], Ok(body.Binary(OpKind::kAdd, bk, one))});

  FunctionBuilder b("while", "i");
  EXPECT_TRUE(b.SetAxisSize(n).ok());
  const int32_t c = b.Parameter(DType::kF32, {});
  const int32_t x = b.Parameter(DType::kF32, {3});
  const int32_t zero = Ok(b.Constant(DType::kI32, {}, Bytes<int32_t>({0})));
  auto results = b.WhileResults(cond_fn, body_fn, {c, zero, x}, 2);
  EXPECT_TRUE(results.ok()) << results.status();
  return MustBuild(b, *results);
}

// Shape ops and reductions, including the attributes the builder stores in
// canonical form (slice steps, pad interiors, reduction axes).
std::shared_ptr<const FunctionIr> ShapeFunction() {
  FunctionBuilder b("shapes", "");
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  const int32_t y = b.Parameter(DType::kF64, {3, 1, 4});
  const int32_t k = b.Parameter(DType::kI32, {5});
  std::vector<int32_t> outs;
  outs.push_back(Ok(b.Reshape(x, {3, 2})));
  outs.push_back(Ok(b.Reshape(x, {6})));
  outs.push_back(Ok(b.BroadcastTo(x, {4, 2, 3})));
  outs.push_back(Ok(b.Transpose(y, {2, 0, 1})));
  outs.push_back(Ok(b.Transpose(x, {-1, 0})));
  outs.push_back(Ok(b.Slice(x, {0, 1}, {2, 3}, {1, 1})));
  outs.push_back(Ok(b.Slice(x, {1, 0}, {2, 3}, {7, 2})));    // one row, step stored as 1
  outs.push_back(Ok(b.Slice(k, {1}, {4}, {5})));              // one element of three
  outs.push_back(Ok(b.Slice(k, {2}, {2}, {3})));              // none
  outs.push_back(Ok(b.Slice(y, {0, 0, 3}, {3, 1, 0 + 4}, {2, 9, 1})));
  outs.push_back(Ok(b.Rev(x, {-1, 0})));
  outs.push_back(Ok(b.Rev(y, {1, 2})));  // the size-1 axis is dropped
  outs.push_back(Ok(b.Pad(x, {1, 0}, {0, 2}, {0, 1})));
  outs.push_back(Ok(b.Pad(y, {0, 1, 0}, {0, 0, 1}, {2, 5, 0})));  // interior of size-1: 0
  outs.push_back(Ok(b.Concatenate(std::vector<int32_t>{x, x, x}, -1)));
  outs.push_back(Ok(b.Concatenate(std::vector<int32_t>{k, k}, 0)));
  const int32_t idx = Ok(b.Constant(DType::kI32, {2, 2}, Bytes<int32_t>({2, 0, -1, 9})));
  const int32_t take = Ok(b.Take(x, idx, 1));
  outs.push_back(take);
  outs.push_back(Ok(b.ScatterAdd(take, idx, 1, 3)));
  outs.push_back(Ok(b.Scatter(Combiner::kSet, x, idx, take, 1, 3)));
  outs.push_back(Ok(b.Scatter(Combiner::kMax, x, idx, Ok(b.Convert(take, DType::kF64)), 1,
                              3)));  // f64 updates converted to f32
  outs.push_back(Ok(b.Scatter(Combiner::kMul, k, Ok(b.Constant(DType::kI32, {}, Bytes<int32_t>({4}))),
                              Ok(b.Constant(DType::kI32, {}, Bytes<int32_t>({3}))), 0, 5)));
  outs.push_back(Ok(b.Scatter(Combiner::kMin, Ok(b.Constant(DType::kBool, {}, {1})),
                              Ok(b.Constant(DType::kI32, {1}, Bytes<int32_t>({0}))),
                              Ok(b.Constant(DType::kBool, {1}, {0})), 0, 0)));  // size 0
  outs.push_back(Ok(b.Cumulative(Combiner::kAdd, x, -1, false)));
  outs.push_back(Ok(b.Cumulative(Combiner::kMul, y, 0, true)));
  outs.push_back(Ok(b.Cumulative(Combiner::kMax, k, 0, false)));
  outs.push_back(Ok(b.Cumulative(Combiner::kMin, y, 2, true)));
  outs.push_back(Ok(b.Sort(x, false)));
  outs.push_back(Ok(b.Sort(y, true)));
  outs.push_back(Ok(b.TopK(x, 2)));
  outs.push_back(Ok(b.TopK(k, 0)));  // k = 0: the wire's default size
  outs.push_back(Ok(b.TopK(y, 4)));
  outs.push_back(Ok(b.Matmul(x, Ok(b.Transpose(x, {1, 0})))));
  const int32_t row = Ok(b.Reshape(x, {1, 6}));
  outs.push_back(Ok(b.Matmul(Ok(b.Reshape(y, {3, 4, 1})), row)));  // batched; f32 -> f64
  outs.push_back(Ok(b.Matmul(Ok(b.Reshape(k, {5, 1})), row)));     // int32 @ f32: f64
  const std::vector<int64_t> last = {-1};
  const std::vector<int64_t> none = {};
  const std::vector<int64_t> both = {1, 0};
  outs.push_back(Ok(b.Reduce(ReduceKind::kSum, x, nullptr, false)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kSum, x, &last, true)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kMean, k, nullptr, true)));  // int32: converts to f64
  outs.push_back(Ok(b.Reduce(ReduceKind::kMax, y, &none, false)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kMin, x, &both, false)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kArgmax, x, nullptr, false)));  // all axes of rank 2
  outs.push_back(Ok(b.Reduce(ReduceKind::kArgmax, x, &last, true)));
  outs.push_back(Ok(b.Reduce(ReduceKind::kArgmax, k, &last, false)));  // rank 1: one axis is all
  // Decompositions: the thin svd of a float32 matrix, the full one of a batch.
  auto thin = b.SvdResults(x, false);
  auto full = b.SvdResults(y, true);
  EXPECT_TRUE(thin.ok() && full.ok());
  outs.insert(outs.end(), thin->begin(), thin->end());
  outs.insert(outs.end(), full->begin(), full->end());
  // An LU decomposition and triangular solves with its factors, every flag.
  const int32_t square = Ok(b.Reshape(Ok(b.Slice(y, {0, 0, 0}, {2, 1, 4}, {1, 1, 1})), {2, 2, 2}));
  auto lu = b.LuResults(square);
  EXPECT_TRUE(lu.ok());
  outs.insert(outs.end(), lu->begin(), lu->end());
  const int32_t rhs = Ok(b.Slice(y, {0, 0, 0}, {2, 1, 2}, {1, 1, 1}));  // f64[2,1,2]
  const int32_t cols = Ok(b.Transpose(rhs, {0, 2, 1}));                  // f64[2,2,1]
  outs.push_back(Ok(b.TriangularSolve((*lu)[0], cols, true, true, false)));
  outs.push_back(Ok(b.TriangularSolve((*lu)[0], cols, false, false, true)));
  auto eigh = b.EighResults(square);
  EXPECT_TRUE(eigh.ok());
  outs.insert(outs.end(), eigh->begin(), eigh->end());
  outs.push_back(Ok(b.Cholesky(square)));
  for (bool complete : {false, true}) {
    auto qr = b.QrResults(y, complete);  // f64[3,1,4]: wide matrices
    EXPECT_TRUE(qr.ok());
    outs.insert(outs.end(), qr->begin(), qr->end());
  }
  return MustBuild(b, outs);
}

// A random function of builder calls (most fail and are skipped, as in
// kernels/function_fuzzer.cc): a wide sample of ops, attributes and types.
std::shared_ptr<const FunctionIr> RandomFunction(std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  auto small = [&] { return static_cast<int64_t>(pick(7)) - 2; };
  auto ints = [&](int max_count) {
    std::vector<int64_t> v(pick(max_count + 1));
    for (int64_t& a : v) a = small();
    return v;
  };
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kI32, DType::kBool, DType::kU32,
                          DType::kBF16};
  const int n = 1 + pick(3);
  FunctionBuilder b("random", pick(4) == 0 ? "" : "i");
  if (pick(3) != 0) {
    EXPECT_TRUE(b.SetAxisSize(n).ok());
  }
  std::vector<int32_t> values;
  for (int i = 0; i < 2; ++i) {
    Dims dims(pick(4));
    for (int64_t& d : dims) d = pick(4);
    values.push_back(b.Parameter(dtypes[pick(6)], dims));
  }
  auto value = [&] { return values[pick(static_cast<int>(values.size()))]; };
  for (int step = 0; step < 40; ++step) {
    absl::StatusOr<int32_t> v = absl::InvalidArgumentError("none");
    switch (pick(29)) {
      case 0: {
        const DType dtype = dtypes[pick(6)];
        Dims dims(pick(3));
        for (int64_t& d : dims) d = pick(4);
        std::vector<uint8_t> bytes(NumElements(dims) * DTypeSize(dtype));
        for (uint8_t& c : bytes) c = static_cast<uint8_t>(dtype == DType::kBool ? pick(2) : rng());
        v = b.Constant(dtype, dims, bytes);
        break;
      }
      case 1: {
        const int32_t x = value();
        v = pick(4) ? b.Convert(x, dtypes[pick(6)]) : b.BitcastConvert(x, dtypes[pick(6)]);
        break;
      }
      // kAdd to kShiftRightArithmetic are the binary ops, and one more.
      case 2: v = b.Binary(static_cast<OpKind>(static_cast<int>(OpKind::kAdd) + pick(20)), value(), value()); break;
      case 3: v = b.Unary(static_cast<OpKind>(static_cast<int>(OpKind::kAbs) + pick(9)), value()); break;
      case 4: v = b.Select(value(), value(), value()); break;
      case 5: v = b.Psum(value(), "i"); break;
      case 6: {
        const std::vector<int64_t> axes = ints(3);
        const int32_t x = value();
        v = b.Reduce(static_cast<ReduceKind>(pick(5)), x, pick(3) == 0 ? nullptr : &axes, pick(2));
        break;
      }
      case 7: v = b.Pcollective(static_cast<OpKind>(static_cast<int>(OpKind::kPmean) + pick(3)), value(), "i"); break;
      case 8: v = b.AxisIndex("i"); break;
      case 9: v = b.AllGather(value(), "i", small()); break;
      case 10: {
        std::vector<std::pair<int64_t, int64_t>> perm;
        for (int s = 0; s < n; ++s) {
          if (pick(3) != 0) perm.emplace_back(s, (s + 1 + pick(n)) % n);
        }
        v = b.Ppermute(value(), "i", perm);
        break;
      }
      case 11: v = b.Copy(value()); break;
      case 12: {
        const std::vector<int64_t> dims = ints(3);
        v = b.Reshape(value(), Dims(dims.begin(), dims.end()));
        break;
      }
      case 13: {
        const std::vector<int64_t> dims = ints(4);
        v = b.BroadcastTo(value(), Dims(dims.begin(), dims.end()));
        break;
      }
      case 14: v = b.Transpose(value(), ints(3)); break;
      case 15: {
        const int32_t x = value();
        const size_t rank = b.type(x).dims.size();
        std::vector<int64_t> start(rank), limit(rank), step(rank);
        for (size_t d = 0; d < rank; ++d) {
          limit[d] = pick(static_cast<int>(b.type(x).dims[d]) + 1);
          start[d] = pick(static_cast<int>(limit[d]) + 1);
          step[d] = 1 + pick(3);
        }
        v = b.Slice(x, start, limit, step);
        break;
      }
      case 16: v = b.Rev(value(), ints(3)); break;
      case 17: {
        const int32_t x = value();
        const size_t rank = b.type(x).dims.size();
        std::vector<int64_t> lo(rank), hi(rank), interior(rank);
        for (size_t d = 0; d < rank; ++d) {
          lo[d] = pick(3);
          hi[d] = pick(3);
          interior[d] = pick(3);
        }
        v = b.Pad(x, lo, hi, interior);
        break;
      }
      case 18: {
        std::vector<int32_t> xs(1 + pick(3));
        for (int32_t& x : xs) x = value();
        v = b.Concatenate(xs, small());
        break;
      }
      case 19: v = b.Take(value(), value(), small()); break;
      case 20: v = b.ScatterAdd(value(), value(), pick(3), 1 + pick(3)); break;
      case 21: v = b.Matmul(value(), value()); break;
      case 22: v = b.AllToAll(value(), "i", small(), small()); break;
      case 23: v = b.PsumScatter(value(), "i", small()); break;
      case 24: v = b.SimulatedCompute(value(), pick(5000)); break;
      case 25: v = b.TopK(value(), small()); break;
      case 26:
        v = b.Scatter(static_cast<Combiner>(pick(5)), value(), value(), value(), pick(3), pick(4));
        break;
      case 27: v = b.Cumulative(static_cast<Combiner>(pick(5)), value(), small(), pick(2)); break;
      case 28: v = b.Sort(value(), pick(2)); break;
    }
    if (v.ok() && b.type(*v).num_elements() <= 256) values.push_back(*v);
  }
  std::vector<int32_t> outs = {values.back()};
  if (values.size() > 3) outs.push_back(values[values.size() / 2]);
  return MustBuild(b, outs);
}

// `a` and `b` are the same function, field by field.
void ExpectSameIr(const FunctionIr& a, const FunctionIr& b) {
  EXPECT_EQ(a.ToText(), b.ToText());
  EXPECT_EQ(a.name(), b.name());
  EXPECT_EQ(a.axis_name(), b.axis_name());
  EXPECT_EQ(a.axis_size(), b.axis_size());
  EXPECT_EQ(a.simulated_ns(), b.simulated_ns());
  EXPECT_EQ(a.params(), b.params());
  EXPECT_EQ(a.outputs(), b.outputs());
  ASSERT_EQ(a.ops().size(), b.ops().size());
  for (size_t i = 0; i < a.ops().size(); ++i) {
    SCOPED_TRACE(testing::Message() << "op " << i);
    const Op& x = a.ops()[i];
    const Op& y = b.ops()[i];
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.operands, y.operands);
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.param_index, y.param_index);
    EXPECT_EQ(x.literal, y.literal);
    EXPECT_EQ(x.axis_name, y.axis_name);
    EXPECT_EQ(x.duration_ns, y.duration_ns);
    EXPECT_EQ(x.reduce_kind, y.reduce_kind);
    EXPECT_EQ(x.axes, y.axes);
    EXPECT_EQ(x.keepdims, y.keepdims);
    EXPECT_EQ(x.axis, y.axis);
    EXPECT_EQ(x.concat_axis, y.concat_axis);
    EXPECT_EQ(x.slice_start, y.slice_start);
    EXPECT_EQ(x.slice_limit, y.slice_limit);
    EXPECT_EQ(x.slice_step, y.slice_step);
    EXPECT_EQ(x.pad_lo, y.pad_lo);
    EXPECT_EQ(x.pad_hi, y.pad_hi);
    EXPECT_EQ(x.pad_interior, y.pad_interior);
    EXPECT_EQ(x.perm_source, y.perm_source);
    EXPECT_EQ(x.combiner, y.combiner);
    EXPECT_EQ(x.reverse, y.reverse);
    EXPECT_EQ(x.body == nullptr, y.body == nullptr);
    if (x.body != nullptr && y.body != nullptr) ExpectSameIr(*x.body, *y.body);
    EXPECT_EQ(x.cond == nullptr, y.cond == nullptr);
    if (x.cond != nullptr && y.cond != nullptr) ExpectSameIr(*x.cond, *y.cond);
    EXPECT_EQ(x.length, y.length);
    EXPECT_EQ(x.num_carries, y.num_carries);
    EXPECT_EQ(x.num_xs, y.num_xs);
    EXPECT_EQ(x.index, y.index);
    EXPECT_EQ(x.full_matrices, y.full_matrices);
    EXPECT_EQ(x.lower, y.lower);
    EXPECT_EQ(x.unit_diagonal, y.unit_diagonal);
    EXPECT_EQ(x.transpose_a, y.transpose_a);
  }
  EXPECT_EQ(a.nesting_depth(), b.nesting_depth());
}

std::shared_ptr<const FunctionIr> RoundTrip(const FunctionIr& ir) {
  auto parsed = ParseFunctionIr(SerializeFunctionIr(ir));
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << ir.ToText();
  if (!parsed.ok()) return nullptr;
  ExpectSameIr(ir, **parsed);
  return *parsed;
}

std::vector<std::shared_ptr<const FunctionIr>> KnownFunctions() {
  return {ElementwiseFunction(), CollectiveFunction(1), CollectiveFunction(2),
          CollectiveFunction(3), ShapeFunction(), BFloat16Function(1), BFloat16Function(3),
          ScanFunction(2), WhileFunction(2)};
}

TEST(FunctionIrWireTest, RoundTripsEveryOpKind) {
  std::set<OpKind> kinds;
  for (const auto& ir : KnownFunctions()) {
    ASSERT_NE(ir, nullptr);
    SCOPED_TRACE(ir->ToText());
    RoundTrip(*ir);
    for (const Op& op : ir->ops()) kinds.insert(op.kind);
  }
  // The functions above use every op of the registry.
  for (int k = 0; k < kNumOpKinds; ++k) {
    EXPECT_TRUE(kinds.count(static_cast<OpKind>(k))) << OpKindName(static_cast<OpKind>(k));
  }
}

TEST(FunctionIrWireTest, SerializationIsCanonical) {
  // Parsing and serializing again gives the same bytes, and ToProto the
  // message that was parsed.
  for (const auto& ir : KnownFunctions()) {
    ASSERT_NE(ir, nullptr);
    const std::string bytes = SerializeFunctionIr(*ir);
    auto parsed = ParseFunctionIr(bytes);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(SerializeFunctionIr(**parsed), bytes);
  }
}

TEST(FunctionIrWireTest, RoundTripsRandomFunctions) {
  std::mt19937 rng(1234);
  int ops = 0;
  for (int i = 0; i < 500; ++i) {
    auto ir = RandomFunction(rng);
    ASSERT_NE(ir, nullptr);
    SCOPED_TRACE(ir->ToText());
    RoundTrip(*ir);
    ops += static_cast<int>(ir->ops().size());
    if (HasFailure()) break;
  }
  EXPECT_GT(ops, 500 * 10);  // the sample is not degenerate
}

TEST(FunctionIrWireTest, NamesAreAnyBytes) {
  FunctionBuilder b(std::string("f\0\xff\xfe", 4), std::string("\xc3\x28", 2));
  const int32_t x = b.Parameter(DType::kF32, {});
  const int32_t s = Ok(b.Psum(x, std::string("\xc3\x28", 2)));
  auto ir = MustBuild(b, {s});
  ASSERT_NE(ir, nullptr);
  RoundTrip(*ir);
}

struct alignas(64) Block {
  uint8_t bytes[64];
};

// Runs `exe` on `num_shards` shards with deterministic inputs; the outputs.
std::vector<std::vector<uint8_t>> RunGang(const FunctionExecutable& exe, int num_shards) {
  const FunctionIr& f = exe.ir();
  std::vector<std::vector<uint8_t>> inputs(f.num_params()), outputs(f.num_outputs());
  std::vector<const void*> in;
  std::vector<void*> out;
  for (int i = 0; i < f.num_params(); ++i) {
    inputs[i].resize(exe.param_bytes(i) * num_shards);
    for (size_t k = 0; k < inputs[i].size(); ++k) {
      inputs[i][k] = static_cast<uint8_t>(k * 37 + 11 + i);
    }
    if (f.param_type(i).dtype == DType::kBool) {
      for (uint8_t& c : inputs[i]) c &= 1;
    }
    in.push_back(inputs[i].data());
  }
  for (int i = 0; i < f.num_outputs(); ++i) {
    outputs[i].assign(exe.output_bytes(i) * num_shards, 0xff);
    out.push_back(outputs[i].data());
  }
  std::vector<Block> scratch((exe.scratch_bytes(num_shards) + 63) / 64 + 1);
  exe.Run(num_shards, in, out, scratch.data());
  return outputs;
}

TEST(FunctionIrWireTest, ParsedFunctionsRunLikeTheOriginal) {
  for (int shards = 1; shards <= 3; ++shards) {
    SCOPED_TRACE(testing::Message() << "shards=" << shards);
    for (const auto& ir : {ElementwiseFunction(), CollectiveFunction(shards), ShapeFunction(),
                           BFloat16Function(shards), ScanFunction(shards),
                           WhileFunction(shards)}) {
      ASSERT_NE(ir, nullptr);
      SCOPED_TRACE(ir->name());
      auto parsed = ParseFunctionIr(SerializeFunctionIr(*ir));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      auto original = FunctionExecutable::Compile(ir);
      auto rebuilt = FunctionExecutable::Compile(*parsed);
      ASSERT_TRUE(original.ok()) << original.status();
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      EXPECT_EQ((*rebuilt)->scratch_bytes(shards), (*original)->scratch_bytes(shards));
      // Bytewise: the same kernels on the same inputs (NaNs included).
      EXPECT_EQ(RunGang(**rebuilt, shards), RunGang(**original, shards));
    }
  }
}

void ExpectWireError(const absl::StatusOr<std::shared_ptr<const FunctionIr>>& result,
                     const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << "parsed:\n" << (*result)->ToText();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_TRUE(absl::StartsWith(result.status().message(), "function wire: ")) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), fragment))
      << result.status() << "\nexpected: " << fragment;
}

TEST(FunctionIrWireTest, TruncatedBytesAreInvalid) {
  for (const auto& ir : KnownFunctions()) {
    ASSERT_NE(ir, nullptr);
    const std::string bytes = SerializeFunctionIr(*ir);
    // Every strict prefix loses at least part of the outputs (the last field).
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto parsed = ParseFunctionIr(absl::string_view(bytes).substr(0, n));
      ASSERT_FALSE(parsed.ok()) << n << " of " << bytes.size() << " bytes parsed";
      ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
    }
  }
}

// Parses `bytes`; an error must be InvalidArgument, and a function that
// parses must round-trip, be the message it came from, and compile; it runs
// when small. Returns whether it parsed.
bool CheckArbitraryBytes(const std::string& bytes) {
  auto parsed = ParseFunctionIr(bytes);
  if (!parsed.ok()) {
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
    EXPECT_TRUE(absl::StartsWith(parsed.status().message(), "function wire: ")) << parsed.status();
    return false;
  }
  const FunctionIr& ir = **parsed;
  RoundTrip(ir);
  wire::FunctionIr received, rebuilt;
  EXPECT_TRUE(received.ParseFromString(bytes));
  ToProto(ir, &rebuilt);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(received, rebuilt))
      << received.DebugString() << "\n" << rebuilt.DebugString();
  auto exe = FunctionExecutable::Compile(*parsed);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return true;
  const int shards = ir.axis_size() > 0 ? static_cast<int>(ir.axis_size()) : 2;
  int64_t bytes_needed = (*exe)->scratch_bytes(shards);
  for (int i = 0; i < ir.num_params(); ++i) bytes_needed += (*exe)->param_bytes(i) * shards;
  for (int i = 0; i < ir.num_outputs(); ++i) bytes_needed += (*exe)->output_bytes(i) * shards;
  if (bytes_needed <= (int64_t{1} << 20) && shards <= 8) RunGang(**exe, shards);
  return true;
}

TEST(FunctionIrWireTest, BitFlipsAreInvalidOrRoundTrip) {
  std::vector<std::string> corpus;
  for (const auto& ir : KnownFunctions()) corpus.push_back(SerializeFunctionIr(*ir));
  std::mt19937 rng(42);
  for (int i = 0; i < 40; ++i) corpus.push_back(SerializeFunctionIr(*RandomFunction(rng)));
  int parsed = 0, rejected = 0;
  for (int m = 0; m < 4000; ++m) {
    std::string bytes = corpus[rng() % corpus.size()];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
    if (CheckArbitraryBytes(bytes)) {
      ++parsed;
    } else {
      ++rejected;
    }
    if (HasFailure()) {
      ADD_FAILURE() << "mutation " << m;
      break;
    }
  }
  // Both outcomes occur (a flip in a literal or a dimension may still give
  // a valid function).
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

// A valid function to corrupt: %0 = f32[2,3] parameter, %1 = i32[] parameter,
// %2 = add %0, %0, axis "i" of size 2.
wire::FunctionIr SmallProto() {
  FunctionBuilder b("small", "i");
  EXPECT_TRUE(b.SetAxisSize(2).ok());
  const int32_t x = b.Parameter(DType::kF32, {2, 3});
  b.Parameter(DType::kI32, {});
  const int32_t y = Ok(b.Binary(OpKind::kAdd, x, x));
  wire::FunctionIr proto;
  ToProto(*MustBuild(b, {y}), &proto);
  return proto;
}

// SmallProto() with op `op` (appended if == size) replaced by `w`.
absl::StatusOr<std::shared_ptr<const FunctionIr>> WithOp(int op, const wire::Op& w) {
  wire::FunctionIr proto = SmallProto();
  if (op == proto.ops_size()) {
    *proto.add_ops() = w;
    proto.set_outputs(0, op);
  } else {
    *proto.mutable_ops(op) = w;
  }
  return FromProto(proto);
}

wire::Op MakeOp(wire::OpKind kind, std::vector<int32_t> operands) {
  wire::Op w;
  w.set_kind(kind);
  for (int32_t v : operands) w.add_operands(v);
  return w;
}

TEST(FunctionIrWireTest, SmallProtoIsValid) {
  auto ir = FromProto(SmallProto());
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_EQ((*ir)->ops().size(), 3u);
}

TEST(FunctionIrWireTest, BadKindsAndEnums) {
  ExpectWireError(WithOp(3, MakeOp(static_cast<wire::OpKind>(999), {0})), "op 3: unknown kind 999");
  ExpectWireError(WithOp(3, MakeOp(static_cast<wire::OpKind>(-1), {0})), "op 3: unknown kind -1");
  wire::Op param = MakeOp(wire::OP_PARAMETER, {});
  param.set_dtype(static_cast<wire::DType>(6));
  ExpectWireError(WithOp(1, param), "op 1 (parameter): unknown dtype 6");
  wire::Op bitcast = MakeOp(wire::OP_BITCAST_CONVERT_TYPE, {0});
  bitcast.set_dtype(static_cast<wire::DType>(7));
  ExpectWireError(WithOp(3, bitcast), "op 3 (bitcast_convert_type): unknown dtype 7");
  wire::Op convert = MakeOp(wire::OP_CONVERT, {0});
  convert.set_dtype(static_cast<wire::DType>(1000));
  ExpectWireError(WithOp(3, convert), "op 3 (convert): unknown dtype 1000");
  wire::Op reduce = MakeOp(wire::OP_REDUCE, {0});
  reduce.set_reduce_kind(static_cast<wire::ReduceKind>(5));
  ExpectWireError(WithOp(3, reduce), "op 3 (reduce): unknown reduce kind 5");
}

TEST(FunctionIrWireTest, BadOperands) {
  ExpectWireError(WithOp(2, MakeOp(wire::OP_ADD, {0, 2})), "op 2 (add): operand 2 is not an earlier op");
  ExpectWireError(WithOp(2, MakeOp(wire::OP_ADD, {0, 7})), "op 2 (add): operand 7 is not an earlier op");
  ExpectWireError(WithOp(2, MakeOp(wire::OP_ADD, {-1, 0})), "op 2 (add): operand -1 is not an earlier op");
  ExpectWireError(WithOp(2, MakeOp(wire::OP_ADD, {0})), "op 2 (add) has 1 operands, takes 2");
  ExpectWireError(WithOp(2, MakeOp(wire::OP_SELECT, {0, 0})), "op 2 (select) has 2 operands, takes 3");
  ExpectWireError(WithOp(2, MakeOp(wire::OP_NEG, {})), "op 2 (neg) has 0 operands, takes 1");
  ExpectWireError(WithOp(1, MakeOp(wire::OP_PARAMETER, {0})), "op 1 (parameter) has 1 operands, takes 0");
  wire::Op concat = MakeOp(wire::OP_CONCATENATE, {0});
  ExpectWireError(WithOp(2, concat), "op 2 (concatenate) has 1 operands, takes at least 2");
  // Operand types are the builder's to check.
  ExpectWireError(WithOp(2, MakeOp(wire::OP_AND, {0, 0})), "op 2: and: operands must be bool");
  ExpectWireError(WithOp(2, MakeOp(wire::OP_MATMUL, {0, 0})), "op 2: matmul: incompatible shapes");
}

TEST(FunctionIrWireTest, BadTypesAndLiterals) {
  wire::Op param = MakeOp(wire::OP_PARAMETER, {});
  param.add_dims(2);
  param.add_dims(-3);
  ExpectWireError(WithOp(0, param), "parameter: negative dimension in f32[2,-3]");
  param.set_dims(1, int64_t{1} << 40);
  ExpectWireError(WithOp(0, param), "is too large (over 2^40 bytes per shard)");
  param.clear_dims();
  for (int d = 0; d <= kMaxWireRank; ++d) param.add_dims(1);
  ExpectWireError(WithOp(0, param), "op 0 (parameter): 65 dims, more than the 64");

  wire::Op constant = MakeOp(wire::OP_CONSTANT, {});
  constant.set_dtype(wire::DTYPE_I32);
  constant.add_dims(2);
  constant.set_literal(std::string(7, 'x'));
  ExpectWireError(WithOp(3, constant), "constant: i32[2] needs 8 bytes, got 7");
  constant.set_literal(std::string(9, 'x'));
  ExpectWireError(WithOp(3, constant), "constant: i32[2] needs 8 bytes, got 9");
  constant.set_dims(0, int64_t{1} << 62);
  ExpectWireError(WithOp(3, constant), "too large");
  constant.set_dtype(wire::DTYPE_BOOL);
  constant.set_dims(0, 2);
  constant.set_literal(std::string("\x01\x02", 2));
  ExpectWireError(WithOp(3, constant), "constant: element 1 of pred[2] is 2; a bool is 0 or 1");

  wire::Op reshape = MakeOp(wire::OP_RESHAPE, {0});
  reshape.add_dims(5);
  ExpectWireError(WithOp(2, reshape), "op 2: reshape: cannot reshape f32[2,3]");
  wire::Op broadcast = MakeOp(wire::OP_BROADCAST_TO, {0});
  broadcast.add_dims(std::numeric_limits<int64_t>::max());
  broadcast.add_dims(2);
  broadcast.add_dims(3);
  ExpectWireError(WithOp(2, broadcast), "broadcast_to: f32[9223372036854775807,2,3] is too large");
}

TEST(FunctionIrWireTest, BadAttributes) {
  wire::Op slice = MakeOp(wire::OP_SLICE, {0});
  for (int64_t v : {0, 4}) slice.add_slice_start(v);
  for (int64_t v : {2, 3}) slice.add_slice_limit(v);
  for (int64_t v : {1, 1}) slice.add_slice_step(v);
  ExpectWireError(WithOp(2, slice), "slice: [4:3:1] is not a valid slice of dimension 1");
  slice.set_slice_start(1, 0);
  slice.set_slice_step(0, 0);
  ExpectWireError(WithOp(2, slice), "slice: [0:2:0] is not a valid slice");
  slice.set_slice_step(0, 1);
  slice.add_slice_step(1);
  ExpectWireError(WithOp(2, slice), "slice: step has 3 entries for f32[2,3] of rank 2");

  wire::Op pad = MakeOp(wire::OP_PAD, {0});
  for (int64_t v : {int64_t{0}, std::numeric_limits<int64_t>::max()}) pad.add_pad_lo(v);
  for (int64_t v : {0, 1}) pad.add_pad_hi(v);
  for (int64_t v : {0, 0}) pad.add_pad_interior(v);
  ExpectWireError(WithOp(2, pad), "pad: padding (9223372036854775807, 1, interior 0) of dimension 1 of f32[2,3] is too large");

  wire::Op transpose = MakeOp(wire::OP_TRANSPOSE, {0});
  transpose.add_axes(1);
  transpose.add_axes(1);
  ExpectWireError(WithOp(2, transpose), "transpose: axes (1, 1) are not a permutation");

  wire::Op sim = MakeOp(wire::OP_SIMULATED_COMPUTE, {0});
  sim.set_duration_ns(-5);
  ExpectWireError(WithOp(2, sim), "simulated_compute: duration must be non-negative");
  sim.set_duration_ns(kMaxSimulatedNs + 1);
  ExpectWireError(WithOp(2, sim), "total simulated time must be at most");

  wire::Op scatter = MakeOp(wire::OP_SCATTER, {0, 1, 0});
  scatter.set_axis(0);
  scatter.set_size(-1);
  ExpectWireError(WithOp(2, scatter), "scatter: updates f32[2,3] do not hold indices i32[] at axis 0 (size -1)");
  scatter.set_size(2);
  scatter.set_combiner(static_cast<wire::Combiner>(9));
  ExpectWireError(WithOp(2, scatter), "unknown combiner 9");

  wire::Op cumulative = MakeOp(wire::OP_CUMULATIVE, {0});
  cumulative.set_combiner(wire::COMBINER_SET);
  ExpectWireError(WithOp(2, cumulative), "cumulative: combiner must be add, mul, max or min, got set");
  cumulative.set_combiner(wire::COMBINER_ADD);
  cumulative.set_axis(-1);  // not canonical: the builder stores 1
  ExpectWireError(WithOp(2, cumulative), "not in the form FunctionBuilder makes it");

  wire::Op take = MakeOp(wire::OP_TAKE, {0, 1});
  take.set_axis(std::numeric_limits<int64_t>::min());
  ExpectWireError(WithOp(2, take), "take: axis -9223372036854775808 is out of range for f32[2,3]");
}

TEST(FunctionIrWireTest, BadCollectives) {
  wire::Op psum = MakeOp(wire::OP_PSUM, {0});
  psum.set_axis_name("j");
  ExpectWireError(WithOp(2, psum), "psum: unbound axis name 'j' (bound: 'i')");

  wire::Op perm = MakeOp(wire::OP_PPERMUTE, {0});
  perm.set_axis_name("i");
  perm.add_perm_source(2);
  perm.add_perm_source(0);
  ExpectWireError(WithOp(2, perm), "ppermute: perm pair (2, 0) is out of range for 2 shards");
  perm.set_perm_source(0, 0);
  ExpectWireError(WithOp(2, perm), "ppermute: perm pair (0, 1) repeats a source or destination");
  perm.set_perm_source(0, -7);
  ExpectWireError(WithOp(2, perm), "ppermute: perm pair (-7, 0) is out of range");
  perm.set_perm_source(0, -1);
  perm.add_perm_source(-1);  // three destinations for two shards
  ExpectWireError(WithOp(2, perm), "op 2 (ppermute) is not in the form FunctionBuilder makes it");

  wire::FunctionIr proto = SmallProto();
  proto.set_axis_size(-2);
  ExpectWireError(FromProto(proto), "axis_size -2 is not in [1, 65536]");
  proto.set_axis_size(int64_t{1} << 40);
  ExpectWireError(FromProto(proto), "axis_size 1099511627776 is not in [1, 65536]");
  // Without an axis size, all_gather is a bad message (not FailedPrecondition).
  proto = SmallProto();
  proto.set_axis_size(0);
  wire::Op gather = MakeOp(wire::OP_ALL_GATHER, {0});
  gather.set_axis_name("i");
  *proto.mutable_ops(2) = gather;
  ExpectWireError(FromProto(proto), "all_gather: the number of shards is unknown");
}

TEST(FunctionIrWireTest, OpsMustBeInTheBuildersForm) {
  // Attributes the kind does not take.
  wire::Op add = MakeOp(wire::OP_ADD, {0, 0});
  add.add_axes(1);
  ExpectWireError(WithOp(2, add), "op 2 (add) is not in the form FunctionBuilder makes it (received -> rebuilt: deleted: axes[0]: 1)");
  add.clear_axes();
  add.set_dtype(wire::DTYPE_F64);
  ExpectWireError(WithOp(2, add), "deleted: dtype: DTYPE_F64");
  add.clear_dtype();
  add.set_literal("x");  // left out of the comparison, so checked on its own
  ExpectWireError(WithOp(2, add), "op 2 (add) has a literal; only constants take one");
  // Non-canonical attributes: a negative axis, unsorted axes.
  wire::Op gather = MakeOp(wire::OP_ALL_GATHER, {0});
  gather.set_axis_name("i");
  gather.set_axis(-1);
  ExpectWireError(WithOp(3, gather), "modified: axis: -1 -> 2");
  wire::Op rev = MakeOp(wire::OP_REV, {0});
  rev.add_axes(1);
  rev.add_axes(0);
  ExpectWireError(WithOp(2, rev), "op 2 (rev) is not in the form FunctionBuilder makes it");
  wire::Op reduce = MakeOp(wire::OP_REDUCE, {0});
  reduce.add_axes(1);
  reduce.add_axes(1);  // two of rank 2: replayed as all axes, (0, 1)
  ExpectWireError(WithOp(2, reduce), "modified: axes[0]: 1 -> 0");
  wire::Op slice = MakeOp(wire::OP_SLICE, {0});
  for (int64_t v : {0, 0}) slice.add_slice_start(v);
  for (int64_t v : {2, 1}) slice.add_slice_limit(v);
  for (int64_t v : {1, 5}) slice.add_slice_step(v);  // one element: sent as limit - start = 1
  ExpectWireError(WithOp(2, slice), "modified: slice_step[1]: 5 -> 1");
  // Ops the builder would not make: conversions it inserts, identities it elides.
  ExpectWireError(WithOp(2, MakeOp(wire::OP_ADD, {0, 1})),
                  "op 2 (add) does not rebuild as one op (the builder gave %4 and 5 ops in all)");
  wire::Op convert = MakeOp(wire::OP_CONVERT, {0});
  convert.set_dtype(wire::DTYPE_F32);
  ExpectWireError(WithOp(2, convert), "op 2 (convert) does not rebuild as one op (the builder gave %0");
  wire::Op reshape = MakeOp(wire::OP_RESHAPE, {0});
  reshape.add_dims(2);
  reshape.add_dims(3);
  ExpectWireError(WithOp(2, reshape), "op 2 (reshape) does not rebuild as one op");
}

TEST(FunctionIrWireTest, BFloat16TravelsAsTheBuilderLegalizedIt) {
  auto ir = BFloat16Function(2);
  ASSERT_NE(ir, nullptr);
  const std::string text = ir->ToText();
  // The float32 computation and its converts are in the IR, and travel.
  EXPECT_TRUE(absl::StrContains(text, "convert %0 : f32[2,2]")) << text;
  EXPECT_TRUE(absl::StrContains(text, "const bf16[4] [1.5, -0.1, nan, 6.53e+04]")) << text;
  auto parsed = RoundTrip(*ir);
  ASSERT_NE(parsed, nullptr);
  // An op on bfloat16 that the builder would compute in float32 is not in
  // its form: it rebuilds as converts, the op and a convert back.
  wire::FunctionIr proto;
  proto.set_name("f");
  wire::Op param = MakeOp(wire::OP_PARAMETER, {});
  param.set_dtype(wire::DTYPE_BF16);
  param.add_dims(3);
  *proto.add_ops() = param;
  proto.add_params(0);
  *proto.add_ops() = MakeOp(wire::OP_ADD, {0, 0});
  proto.add_outputs(1);
  ExpectWireError(FromProto(proto), "op 1 (add) does not rebuild as one op (the builder gave %3");
  // A literal of two bytes per element.
  wire::Op constant = MakeOp(wire::OP_CONSTANT, {});
  constant.set_dtype(wire::DTYPE_BF16);
  constant.add_dims(2);
  constant.set_literal(std::string("\x80\x3f\x00\xc0", 4));  // 1.0, -2.0
  *proto.mutable_ops(1) = constant;
  proto.set_outputs(0, 1);
  auto ok = FromProto(proto);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(absl::StrContains((*ok)->ToText(), "const bf16[2] [1, -2]")) << (*ok)->ToText();
  constant.set_literal(std::string("\x80\x3f\x00", 3));
  *proto.mutable_ops(1) = constant;
  EXPECT_FALSE(FromProto(proto).ok());
}

TEST(FunctionIrWireTest, BadParamsAndOutputs) {
  wire::FunctionIr proto = SmallProto();
  proto.clear_outputs();
  ExpectWireError(FromProto(proto), "build: function @small needs at least one output");
  proto.add_outputs(3);
  ExpectWireError(FromProto(proto), "return: operand %3 is not a value of this function");
  proto = SmallProto();
  proto.set_params(1, 2);
  ExpectWireError(FromProto(proto), "params lists 2 values, which are not the 2 parameter ops");
  proto.add_params(1);
  ExpectWireError(FromProto(proto), "params lists 3 values");
}

TEST(FunctionIrWireTest, BytesThatAreNotAFunction) {
  ExpectWireError(ParseFunctionIr("\xff\xff\xff"), "3 bytes that are not a serialized pw.wire.FunctionIr");
  ExpectWireError(ParseFunctionIr(""), "needs at least one output");
  // A field this build does not know, in the function and in an op.
  std::string bytes = SerializeFunctionIr(*FromProto(SmallProto()).value());
  ExpectWireError(ParseFunctionIr(bytes + std::string("\xb8\x06\x01", 3)),
                  "the function has a field this build does not know (number 103)");
  wire::FunctionIr proto = SmallProto();
  std::string op_bytes = proto.ops(2).SerializeAsString() + std::string("\xb8\x06\x01", 3);
  ASSERT_TRUE(proto.mutable_ops(2)->ParseFromString(op_bytes));
  ExpectWireError(FromProto(proto), "op 2 has a field this build does not know (number 103)");
}


wire::FunctionIr ProtoOf(const FunctionIr& ir) {
  wire::FunctionIr proto;
  ToProto(ir, &proto);
  return proto;
}

TEST(FunctionIrWireTest, BadScans) {
  const wire::FunctionIr good = ProtoOf(*ScanFunction(2));
  ASSERT_TRUE(FromProto(good).ok());
  auto first_scan = [](wire::FunctionIr& proto) {
    for (wire::Op& op : *proto.mutable_ops()) {
      if (op.kind() == wire::OP_SCAN) return &op;
    }
    return static_cast<wire::Op*>(nullptr);
  };
  {
    wire::FunctionIr proto = good;
    first_scan(proto)->clear_body();
    ExpectWireError(FromProto(proto), "op 4 (scan) has no body");
  }
  {
    wire::FunctionIr proto = good;
    *proto.mutable_ops(0)->mutable_body() = good;  // a parameter with a body
    ExpectWireError(FromProto(proto), "op 0 (parameter) has a body; only loops take one");
  }
  {
    wire::FunctionIr proto = good;
    first_scan(proto)->set_length(5);
    ExpectWireError(FromProto(proto),
                    "op 4: scan of @dot: xs 0 is f32[4,3], which needs a leading dimension of the "
                    "length, 5");
  }
  {
    wire::FunctionIr proto = good;
    first_scan(proto)->set_num_carries(-1);
    ExpectWireError(FromProto(proto), "op 4: scan: -1 carries and 1 xs do not fit in 3 operands");
  }
  {
    // An error inside a body names the scan and the body's op.
    wire::FunctionIr proto = good;
    first_scan(proto)->mutable_body()->mutable_ops(3)->set_kind(wire::OP_AND);
    ExpectWireError(FromProto(proto), "op 4 (scan) body: op 3: and: operands must be bool");
  }
  {
    wire::FunctionIr proto = good;
    proto.mutable_ops(5)->set_index(2);
    ExpectWireError(FromProto(proto), "op 5: get_element: index 2 is out of range for (f32[], f32[4,3])");
  }
  {
    wire::FunctionIr proto = good;
    proto.mutable_ops(5)->set_length(3);  // an attribute get_element does not take
    ExpectWireError(FromProto(proto), "op 5 (get_element) is not in the form FunctionBuilder makes it");
  }
  {
    // A tuple as an output.
    wire::FunctionIr proto = good;
    proto.set_outputs(0, 4);
    ExpectWireError(FromProto(proto), "return: operand %4 is the scan tuple");
  }
}

TEST(FunctionIrWireTest, BadWhiles) {
  const wire::FunctionIr good = ProtoOf(*WhileFunction(2));
  ASSERT_TRUE(FromProto(good).ok());
  const int loop = 3;  // after the two parameters and the constant
  ASSERT_EQ(good.ops(loop).kind(), wire::OP_WHILE);
  {
    wire::FunctionIr proto = good;
    proto.mutable_ops(loop)->clear_cond();
    ExpectWireError(FromProto(proto), "op 3 (while) has no cond");
  }
  {
    wire::FunctionIr proto = good;
    proto.mutable_ops(loop)->clear_body();
    ExpectWireError(FromProto(proto), "op 3 (while) has no body");
  }
  {
    wire::FunctionIr proto = good;
    *proto.mutable_ops(0)->mutable_cond() = good;  // a parameter with a cond
    ExpectWireError(FromProto(proto), "op 0 (parameter) has a cond; only while loops take one");
  }
  {
    // The cond and the body swapped: the body returns no bool.
    wire::FunctionIr proto = good;
    std::swap(*proto.mutable_ops(loop)->mutable_cond(), *proto.mutable_ops(loop)->mutable_body());
    ExpectWireError(FromProto(proto),
                    "op 3: while of @grow and @less: the cond must return one bool scalar "
                    "(pred[]), it returns (f32[], i32[])");
  }
  {
    wire::FunctionIr proto = good;
    proto.mutable_ops(loop)->set_num_carries(0);
    ExpectWireError(FromProto(proto), "op 3: while: 0 carries do not fit in 3 operands");
  }
  {
    wire::FunctionIr proto = good;
    proto.mutable_ops(loop)->set_length(2);  // an attribute a while does not take
    ExpectWireError(FromProto(proto), "op 3 (while) is not in the form FunctionBuilder makes it");
  }
  {
    // Errors inside the cond and the body name the loop and which.
    wire::FunctionIr proto = good;
    proto.mutable_ops(loop)->mutable_cond()->mutable_ops(4)->set_kind(wire::OP_MATMUL);
    ExpectWireError(FromProto(proto), "op 3 (while) cond: op 4: matmul");
    proto = good;
    proto.mutable_ops(loop)->mutable_body()->mutable_ops(0)->set_kind(wire::OP_WHILE);
    ExpectWireError(FromProto(proto), "op 3 (while) body: op 0 (while) has no body");
  }
}

// Bodies nested deeper than kMaxNestingDepth are refused before they are
// decoded, however deep the message goes (each level one byte or so).
TEST(FunctionIrWireTest, DeepNestingIsRefused) {
  auto nested = [](int depth) {
    FunctionBuilder b0("b", "");
    const int32_t c = b0.Parameter(DType::kF32, {});
    wire::FunctionIr proto;
    ToProto(*MustBuild(b0, {c}), &proto);
    for (int d = 0; d < depth; ++d) {
      wire::FunctionIr outer;
      outer.set_name("b");
      wire::Op* p = outer.add_ops();
      p->set_kind(wire::OP_PARAMETER);
      outer.add_params(0);
      wire::Op* scan = outer.add_ops();
      scan->set_kind(wire::OP_SCAN);
      scan->add_operands(0);
      scan->set_num_carries(1);
      scan->set_length(2);
      *scan->mutable_body() = std::move(proto);
      wire::Op* get = outer.add_ops();
      get->set_kind(wire::OP_GET_ELEMENT);
      get->add_operands(1);
      outer.add_outputs(2);
      proto = std::move(outer);
    }
    return proto;
  };
  auto ok = FromProto(nested(kMaxNestingDepth));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->nesting_depth(), kMaxNestingDepth);
  ExpectWireError(FromProto(nested(kMaxNestingDepth + 1)), "loop bodies nest more than 32 deep");
  ExpectWireError(FromProto(nested(90)), "loop bodies nest more than 32 deep");
}

}  // namespace
}  // namespace pw
