#ifndef PATHWAYS_FUNCTION_IR_FUNCTION_IR_H_
#define PATHWAYS_FUNCTION_IR_FUNCTION_IR_H_

// The IR of a compiled function (paper §3, Appendix B): one shard's program
// of a pmap'd function, with every value's type (dtype and per-shard shape)
// known before it runs. It is traced once per input signature by the Python
// front end through FunctionBuilder, and run by kernels/FunctionExecutable on
// all shards of a gang together.
//
// Values are in SSA form: each Op defines one value, named by its index in
// ops(); operands refer to earlier ops only.
//
// bfloat16 is stored in bfloat16 and computed in float32 (as XLA's CPU
// backend does), and the builder is where that happens: an op that computes
// (arithmetic, comparisons, transcendental functions, reductions, matmul,
// scatter_add, top_k and the reducing collectives) on bfloat16 values is
// recorded as convert-to-f32, the op in float32, convert-to-bf16 (round to
// nearest even, NaN kept), so every result is the float32 result of the
// bfloat16 inputs rounded once. Reductions, matmul and psum accumulate in
// float32 and round once. The IR text shows these converts, and the wire
// format carries the legalized ops, which replay to themselves. Only the
// convert kernel and the kernels that move elements without looking at them
// (data movement, concatenate, pad, take, select, all_gather, ppermute,
// all_to_all, simulated_compute) take bfloat16; FunctionExecutable::Compile
// refuses any other op on it.
//
// Loops (as jax.lax.scan; the design is XLA's While with a tuple and
// get-tuple-element). A kScan op holds a nested function, its body, and
// runs it `length` times. Its operands are the carries (num_carries), then
// the xs (num_xs, each with a leading dimension of `length`), then the
// consts (the rest: the same in every iteration, the values the body closes
// over). The body has one parameter per operand, in that order: a carry's
// type, an xs's type without its leading dimension (iteration i's slice), a
// const's type. It returns the next carries (each of its carry's exact type)
// and then any number of ys. Iteration i (0 .. length-1, or length-1 .. 0
// with `reverse`) reads slice i of every xs and writes slice i of every
// stacked y. The scan's value is a tuple: the final carries, then each y
// stacked along a new leading dimension of `length` (length 0: the carries
// are their initial values, the ys empty). get_element[k] ops name its
// elements; they are the only ops that read a tuple, and a function never
// returns one, so every other value is an array. One op for the whole loop
// keeps tracing time and IR size independent of the trip count, and the
// executable plans the body once (kernels/function_executable.h). The body
// is an ordinary FunctionIr, built and checked by its own FunctionBuilder
// (with the function's axis name and size when it has collectives), shared
// rather than copied; loops nest at most kMaxNestingDepth deep.
//
// A kWhile op (as jax.lax.while_loop; XLA's While) holds two nested
// functions, its cond and its body, and a trip count that only the device
// knows: while cond(carries, consts) is true, carries = body(carries,
// consts). Its operands are the carries (num_carries, at least one), then
// the consts. Both functions take one parameter per operand, of its type;
// the cond returns one bool scalar (pred[]) and the body the next carries, each of
// its carry's exact type. Its value is the tuple of the final carries
// (the initial ones if the cond is false at once), taken apart by
// get_element as a scan's. Each shard of a gang runs its own trip count:
// with several shards in one run, the loop goes on while any shard's cond
// is true, and a shard whose cond is false keeps its carries (a batched
// while, as XLA's under vmap); a collective in a body therefore sees every
// shard each iteration (JAX calls a collective in a loop whose trip counts
// differ across devices a user error). Since its trip count is unknown, a
// while's cond and body may not have simulated compute.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "csrc/base/dtype.h"
#include "csrc/function_ir/op_registry.h"

namespace pw {

class FunctionIr;

// OpKind, OpKindName and the per-op classification: see op_registry.h.


// Which reduction a kReduce op computes.
enum class ReduceKind : uint8_t { kSum, kMean, kMax, kMin, kArgmax };

// "sum", "mean", "max", "min", "argmax".
absl::string_view ReduceKindName(ReduceKind kind);

// How kCumulative combines an element with the running value, and kScatter
// an update with the element it lands on. Max and min propagate NaN, as
// numpy.maximum; kSet (scatter only) replaces the element.
enum class Combiner : uint8_t { kAdd, kMul, kMax, kMin, kSet };

// "add", "mul", "max", "min", "set".
absl::string_view CombinerName(Combiner combiner);

// The numpy broadcast of two shapes (aligned from the right; size-1
// dimensions stretch), or false if they are incompatible.
bool BroadcastDims(absl::Span<const int64_t> a, absl::Span<const int64_t> b, Dims* out);

// The per-shard type of a value: an array of `dtype` and `dims`, or (a
// scan's value only) a tuple of arrays, `elements`.
struct ValueType {
  ValueType() = default;
  ValueType(DType dtype, Dims dims) : dtype(dtype), dims(std::move(dims)) {}

  DType dtype = DType::kF32;
  Dims dims;
  std::vector<ValueType> elements;  // a tuple's (never empty), else empty

  bool is_tuple() const { return !elements.empty(); }
  // A tuple's: the sums over its elements.
  int64_t num_elements() const {
    if (!is_tuple()) return NumElements(dims);
    int64_t n = 0;
    for (const ValueType& e : elements) n += e.num_elements();
    return n;
  }
  int64_t num_bytes() const {
    if (!is_tuple()) return NumElements(dims) * DTypeSize(dtype);
    int64_t n = 0;
    for (const ValueType& e : elements) n += e.num_bytes();
    return n;
  }
  // "f32[2,3]"; a tuple "(f32[], i32[4])".
  std::string ToString() const {
    if (!is_tuple()) return TypeToString(dtype, dims);
    std::string text = "(";
    for (size_t i = 0; i < elements.size(); ++i) {
      if (i > 0) text += ", ";
      text += elements[i].ToString();
    }
    return text + ")";
  }
  friend bool operator==(const ValueType& a, const ValueType& b) {
    return a.dtype == b.dtype && a.dims == b.dims && a.elements == b.elements;
  }
};

struct Op {
  OpKind kind = OpKind::kParameter;
  absl::InlinedVector<int32_t, 2> operands;  // indices of earlier ops
  ValueType type;                            // type of the value this op defines
  int32_t param_index = -1;                  // kParameter only
  std::vector<uint8_t> literal;              // kConstant only: row-major elements of `type`
  std::string axis_name;                     // collectives only
  int64_t duration_ns = 0;                   // kSimulatedCompute only
  ReduceKind reduce_kind = ReduceKind::kSum;  // kReduce only
  std::vector<int64_t> axes;                 // kReduce, kRev: sorted; kTranspose: the permutation
  bool keepdims = false;                     // kReduce only
  // kAllGather, kConcatenate, kTake, kScatter, kPsumScatter, kCumulative; kAllToAll:
  // the split axis. (kTopK keeps its k as the last dim of its type.)
  int64_t axis = 0;
  Combiner combiner = Combiner::kAdd;        // kCumulative, kScatter
  // kCumulative and kScan: from the end; kSort: descending.
  bool reverse = false;
  int64_t concat_axis = 0;                   // kAllToAll only
  std::vector<int64_t> slice_start, slice_limit, slice_step;  // kSlice only
  std::vector<int64_t> pad_lo, pad_hi, pad_interior;         // kPad only
  std::vector<int64_t> perm_source;          // kPpermute only: source per destination
  // kScan (see "Loops" above): the body, the trip count, how the operands
  // split (carries, xs, then consts); its direction is `reverse`. kWhile:
  // the body, the cond, and how many operands are carries (the rest consts).
  std::shared_ptr<const FunctionIr> body;
  std::shared_ptr<const FunctionIr> cond;  // kWhile only
  int64_t length = 0;
  int32_t num_carries = 0;
  int32_t num_xs = 0;
  int32_t index = 0;  // kGetElement only: which element of the tuple
  bool full_matrices = false;  // kSvd: square u and vt; kQr: square q
  // kTriangularSolve only: a's triangle, unit diagonal, solve with a^T.
  bool lower = false;
  bool unit_diagonal = false;
  bool transpose_a = false;
};

// An immutable, validated function. Thread-safe (read-only after Build).
class FunctionIr {
 public:
  const std::string& name() const { return name_; }
  // The pmap axis name collectives refer to; empty when the function has none.
  const std::string& axis_name() const { return axis_name_; }
  // The number of shards the function was traced for (0: not given). When
  // set, CompiledFunction::Create checks it against its devices.
  int64_t axis_size() const { return axis_size_; }
  absl::Span<const Op> ops() const { return ops_; }
  // Op index of each parameter, in parameter order.
  absl::Span<const int32_t> params() const { return params_; }
  // Op index of each output, in output order (an op may appear twice).
  absl::Span<const int32_t> outputs() const { return outputs_; }
  const ValueType& param_type(int i) const { return ops_[params_[i]].type; }
  const ValueType& output_type(int i) const { return ops_[outputs_[i]].type; }
  int num_params() const { return static_cast<int>(params_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  // True if any op is a collective (the gang must run all shards together),
  // including the ops of loop bodies.
  bool has_collectives() const;
  // How deeply loops nest: 0 without a loop, else 1 + the deepest nested
  // function's (a body's or a while's cond's).
  int nesting_depth() const { return nesting_depth_; }
  // Simulated device time of one run: the sum of its kSimulatedCompute ops.
  int64_t simulated_ns() const { return simulated_ns_; }

  // Human-readable text, e.g.
  //   func @f(%0: f32[], %1: f32[3]) axis=i {
  //     %2 = const f32[] 2
  //     %3 = mul %0, %2 : f32[]
  //     %4 = psum[i] %3 : f32[]
  //     return %4
  //   }
  // A scan shows its body once, nested and indented under it, whatever its
  // length:
  //     %5 = scan[length=100,carries=1,xs=1] %0, %1 : (f32[], f32[100]) {
  //       func @body(%0: f32[], %1: f32[]) {
  //         ...
  //       }
  //     }
  //     %6 = get_element[0] %5 : f32[]
  // A while shows its cond, then its body:
  //     %7 = while[carries=1] %0, %1 : (f32[]) {
  //       func @cond(%0: f32[], %1: f32[]) {
  //         ...
  //       }
  //       func @body(%0: f32[], %1: f32[]) {
  //         ...
  //       }
  //     }
  std::string ToText() const;

 private:
  friend class FunctionBuilder;
  std::string name_;
  std::string axis_name_;
  int64_t axis_size_ = 0;
  std::vector<Op> ops_;
  std::vector<int32_t> params_;
  std::vector<int32_t> outputs_;
  int64_t simulated_ns_ = 0;
  int nesting_depth_ = 0;
  void AppendText(std::string* text, int indent) const;
};

// The most simulated time one run of a function may take, summed over its
// simulated_compute ops: one hour. A gang's device time (duration x devices,
// up to 65536 devices) then stays far inside int64 nanoseconds.
inline constexpr int64_t kMaxSimulatedNs = int64_t{3600} * 1'000'000'000;

// How deeply loops may nest (a scan in a scan's body is depth 2). Bounds
// the recursion of everything that walks bodies (compiling, running, text,
// the wire decoder) whatever a function or a message holds.
inline constexpr int kMaxNestingDepth = 32;

// The most shards a function may be traced for: the most devices a cluster
// has (cluster.h's kMaxDevices).
inline constexpr int64_t kMaxAxisSize = int64_t{1} << 16;

// Builds a FunctionIr op by op, inferring and checking types as it goes, so
// that shape and dtype errors surface at trace time with the op's name and the
// shapes involved. Every error is InvalidArgument; those for an operand's
// dtype (bool where a number is needed, a non-bool condition, non-int32
// indices) are of kind kUnsupportedType and those for an unbound axis name of
// kind kUnboundName (error_kind.h), which Python raises as TypeError and
// NameError. Not thread-safe; one builder per trace.
class FunctionBuilder {
 public:
  FunctionBuilder(std::string name, std::string axis_name);

  // Adds the next parameter; returns its value. The builder must not be
  // built yet (built() false).
  int32_t Parameter(DType dtype, Dims dims);

  // A constant. `bytes` must hold NumElements(dims) elements of `dtype`,
  // row-major, each byte of a bool 0 or 1; InvalidArgument otherwise.
  absl::StatusOr<int32_t> Constant(DType dtype, Dims dims, absl::Span<const uint8_t> bytes);

  // Elementwise cast, as numpy's astype: float to an integer truncates
  // toward zero; out of range, NaN included, int32 gets INT32_MIN (x86
  // numpy's answer) and uint32 saturates to [0, 2^32 - 1] with NaN giving 0
  // (XLA's; numpy's is undefined); between int32 and uint32 the bits stay.
  // To bfloat16 rounds to nearest even through float32 (base/bfloat16.h).
  // Returns `x` itself when it already has `dtype`, and the value made by an
  // earlier bfloat16-to-float32 convert of `x` when there is one.
  absl::StatusOr<int32_t> Convert(int32_t x, DType dtype);

  // jax.lax.bitcast_convert_type: `x`'s bits read as `dtype`, which must have
  // the same width (float32, int32 and uint32 among themselves);
  // InvalidArgument of kind kUnsupportedType otherwise. Returns `x` itself
  // when it already has `dtype`.
  absl::StatusOr<int32_t> BitcastConvert(int32_t x, DType dtype);

  // A binary elementwise op: kAdd, kSub, kMul, kDiv, kPow, kRem, kMax, kMin, a
  // comparison (kEq ... kGe), a bitwise op (kAnd, kOr, kXor: logical on
  // bools) or a shift (kShiftLeft, kShiftRightLogical,
  // kShiftRightArithmetic). Shapes broadcast as in numpy (aligned from the
  // right; a dimension of size 1 stretches). Mixed dtypes are promoted
  // (Converts are inserted); kDiv of integer or bool operands is true
  // division in float64, kPow, kRem and shifts of two bools compute in int32.
  // Comparisons give bool. A bfloat16 result is computed in float32 and
  // rounded (see the top of this file). InvalidArgument names the op and both types for
  // incompatible shapes ("add: incompatible shapes f32[2] and f32[3]"), for
  // bitwise ops and shifts of floats, and for kSub of two bools (as numpy).
  absl::StatusOr<int32_t> Binary(OpKind kind, int32_t a, int32_t b);

  // A unary elementwise op: kNeg, kAbs, kExp, kLog, kTanh, kSqrt, kRsqrt,
  // kSin, kCos or kNot. kNot needs a bool (logical not) or integer (bitwise
  // not) operand and kNeg a numeric one; the transcendental ops convert
  // integers to float64 and bool to float32; bfloat16 computes in float32.
  absl::StatusOr<int32_t> Unary(OpKind kind, int32_t x);

  // where(cond, x, y): cond must be bool; x and y are promoted to a common
  // type; the three shapes broadcast together. InvalidArgument otherwise
  // ("select: incompatible shapes pred[2], f32[3] and f32[]").
  absl::StatusOr<int32_t> Select(int32_t cond, int32_t x, int32_t y);

  // All-reduce sum over the axis `axis_name`, which must be the builder's
  // axis name; InvalidArgument ("psum: unbound axis name 'j' (bound: 'i')")
  // otherwise. A bool value is summed as int32 (a count, as numpy's sum).
  absl::StatusOr<int32_t> Psum(int32_t x, absl::string_view axis_name);

  // A reduction of `x` over `axes` (empty optional: all axes; negative axes
  // count from the end), as numpy's sum/mean/max/min/argmax. Result dtypes as
  // numpy: sum of bool or int32 is int32, mean of bool or int32 is float64,
  // argmax is int32 (numpy's int64 narrowed); sum and mean of bfloat16 are
  // bfloat16, accumulated in float32. argmax takes at most one axis
  // (all axes: the index into the flattened value). InvalidArgument names
  // the op and the type ("sum: axis 2 is out of range for f32[3,4]") for an
  // out-of-range or repeated axis, and for max/min/argmax of an empty
  // reduction.
  absl::StatusOr<int32_t> Reduce(ReduceKind kind, int32_t x, const std::vector<int64_t>* axes,
                                 bool keepdims);

  // pmean / pmax / pmin over the axis `axis_name` (checked as Psum). The
  // result has the type of `x`; pmean of int32 truncates toward zero (as
  // JAX), pmean of bool is InvalidArgument.
  absl::StatusOr<int32_t> Pcollective(OpKind kind, int32_t x, absl::string_view axis_name);

  // The index of the shard along `axis_name` (int32 scalar).
  absl::StatusOr<int32_t> AxisIndex(absl::string_view axis_name);

  // Declares the number of shards (the pmap axis size), which all_gather and
  // ppermute need. InvalidArgument unless 1 <= n <= kMaxAxisSize (so sizes
  // scaled by it, as in all_to_all, cannot overflow before they are checked).
  absl::Status SetAxisSize(int64_t n);

  // all_gather(x, axis_name, axis): the values of all shards stacked along a
  // new dimension inserted at `axis` (in [-rank-1, rank]).
  absl::StatusOr<int32_t> AllGather(int32_t x, absl::string_view axis_name, int64_t axis);

  // ppermute(x, axis_name, perm): (source, destination) pairs, each source
  // and destination at most once and in [0, axis size); destinations not
  // named receive zeros (JAX semantics).
  absl::StatusOr<int32_t> Ppermute(int32_t x, absl::string_view axis_name,
                                   const std::vector<std::pair<int64_t, int64_t>>& perm);

  // --- Shape ops. InvalidArgument names the op and the types involved. ---

  // A new value equal to `x` (never returns `x` itself).
  absl::StatusOr<int32_t> Copy(int32_t x);

  // `x` with new dims of the same number of elements (row-major).
  absl::StatusOr<int32_t> Reshape(int32_t x, Dims dims);

  // numpy broadcast_to: `x`'s dims aligned from the right, size-1 dims stretch.
  absl::StatusOr<int32_t> BroadcastTo(int32_t x, Dims dims);

  // numpy transpose: result dim d is x's dim perm[d]; perm is a permutation.
  absl::StatusOr<int32_t> Transpose(int32_t x, const std::vector<int64_t>& perm);

  // x[start:limit:step] per dimension: 0 <= start <= limit <= dim, step >= 1.
  absl::StatusOr<int32_t> Slice(int32_t x, const std::vector<int64_t>& start,
                                const std::vector<int64_t>& limit,
                                const std::vector<int64_t>& step);

  // `x` reversed along `axes` (negative axes count from the end).
  absl::StatusOr<int32_t> Rev(int32_t x, const std::vector<int64_t>& axes);

  // Zero padding: lo[d] before, hi[d] after, interior[d] between elements of
  // dimension d (all >= 0).
  absl::StatusOr<int32_t> Pad(int32_t x, const std::vector<int64_t>& lo,
                              const std::vector<int64_t>& hi,
                              const std::vector<int64_t>& interior);

  // numpy concatenate along `axis`: same rank, equal dims off the axis;
  // dtypes promote.
  absl::StatusOr<int32_t> Concatenate(absl::Span<const int32_t> xs, int64_t axis);

  // numpy take(x, indices, axis) with int32 indices clipped into range.
  absl::StatusOr<int32_t> Take(int32_t x, int32_t indices, int64_t axis);

  // The inverse of Take: `operand` with `updates` combined into it at
  // `indices` along `axis`. `updates` has the dims of a Take result: the
  // result's dims with the one at `axis` replaced by the indices' dims; the
  // result has `size` at `axis` (>= 0; 0 takes no index in range) and
  // `operand`'s dtype. `operand` has the result's dims, or is a scalar
  // broadcast to them. `updates` is converted to `operand`'s dtype; kSet
  // replaces the element (the last update in index order wins), the others
  // combine (duplicate indices accumulate, in index order). Indices outside
  // [0, size) are skipped, as JAX's scatters drop them (negative ones too).
  // InvalidArgument ("scatter: ...") for non-int32 indices, dims that do not
  // fit, a bool operand with kAdd or kMul (as JAX; kMax and kMin are or and
  // and), an unknown combiner.
  absl::StatusOr<int32_t> Scatter(Combiner combiner, int32_t operand, int32_t indices,
                                  int32_t updates, int64_t axis, int64_t size);

  // The transpose of Take: zeros of `updates`' dtype with x's dims (`size`
  // at `axis`) plus `updates` added at the indexed positions (a zero
  // constant and a kScatter; indices out of range add nothing). Bool
  // updates are refused.
  absl::StatusOr<int32_t> ScatterAdd(int32_t updates, int32_t indices, int64_t axis,
                                     int64_t size);

  // jax.lax.top_k's indices: for each row along the last axis of `x` (rank
  // >= 1, any dtype), the int32 positions of its `k` largest elements,
  // largest first; equal elements in increasing position, floats in IEEE
  // totalOrder (NaN above +inf, a NaN with its sign bit set below -inf, -0
  // below +0). The result has x's dims with the last one k. The values are
  // a take of these positions (the front end's lax.top_k). InvalidArgument
  // for a zero-dimensional `x`, k outside [0, last dim], or a last dim
  // beyond int32 positions.
  absl::StatusOr<int32_t> TopK(int32_t x, int64_t k);

  // numpy's argsort of each row along the last axis of `x` (rank >= 1, any
  // dtype), stable: the int32 positions of the row's elements in increasing
  // order (decreasing when `descending`), equal elements in increasing
  // position either way (as jax.numpy.argsort). Floats in numpy's order: NaN
  // after +inf (before it when descending), whatever its sign; -0 equal to
  // +0. The result has x's dims. InvalidArgument for a zero-dimensional `x`
  // or a last dim beyond int32 positions.
  absl::StatusOr<int32_t> Sort(int32_t x, bool descending);

  // numpy's cumsum (kAdd), cumprod (kMul), maximum.accumulate (kMax) and
  // minimum.accumulate (kMin) of `x` along `axis` (rank >= 1; negative
  // counts from the end): element i combines elements 0..i, or i..n-1 when
  // `reverse` (jax.lax.cumsum's reverse). Sums and products of bool are
  // int32 (the operand is converted), as numpy's of a bool array (JAX's
  // int32); max and min of bool are or and and. InvalidArgument for an
  // out-of-range axis, a zero-dimensional `x` or kSet.
  absl::StatusOr<int32_t> Cumulative(Combiner combiner, int32_t x, int64_t axis, bool reverse);

  // numpy matmul of values of rank >= 2 (batch dims broadcast; dtypes promote).
  absl::StatusOr<int32_t> Matmul(int32_t a, int32_t b);

  // JAX all_to_all over `axis_name`: dims[split_axis] must divide by the
  // axis size.
  absl::StatusOr<int32_t> AllToAll(int32_t x, absl::string_view axis_name, int64_t split_axis,
                                   int64_t concat_axis);

  // JAX psum_scatter over `axis_name` (dims[axis] must equal the axis size).
  absl::StatusOr<int32_t> PsumScatter(int32_t x, absl::string_view axis_name, int64_t axis);

  // Identity on `x` that adds `duration_ns` to the function's simulated time.
  // InvalidArgument for a negative duration, or if the function's total
  // simulated time would exceed kMaxSimulatedNs.
  absl::StatusOr<int32_t> SimulatedCompute(int32_t x, int64_t duration_ns);
  // The same with the duration in microseconds (pw.simulated_compute's
  // unit); InvalidArgument also for NaN, infinities and durations beyond
  // kMaxSimulatedNs.
  absl::StatusOr<int32_t> SimulatedComputeMicros(int32_t x, double microseconds);

  // --- Loops (see "Loops" above) ---

  // A scan of `body` over `operands` (carries, xs, consts: num_carries and
  // num_xs of them, the rest consts), `length` iterations, backwards when
  // `reverse`. Returns the tuple value; GetElement takes it apart (or use
  // ScanResults). InvalidArgument names the scan and what does not fit: a
  // negative count or length, a body whose parameters are not the operands'
  // types (an xs's without its leading dimension, which must be `length`),
  // fewer outputs than carries, a next carry of another type than its carry,
  // a body with collectives traced for another axis name or size, a body
  // nested too deep (kMaxNestingDepth), or a total simulated time (length x
  // the body's) beyond kMaxSimulatedNs.
  absl::StatusOr<int32_t> Scan(std::shared_ptr<const FunctionIr> body,
                               absl::Span<const int32_t> operands, int32_t num_carries,
                               int32_t num_xs, int64_t length, bool reverse);

  // A while loop (see "Loops" above): runs `body` on `operands` (the first
  // `num_carries` of them carries, the rest consts) while `cond` of them is
  // true. Returns the tuple value of the final carries; GetElement takes it
  // apart (or use WhileResults). InvalidArgument names the loop and what does
  // not fit: no carry or more carries than operands, a cond or body whose
  // parameters are not the operands' types, a cond that does not return one
  // bool scalar, a body that does not return one value per carry of the
  // carry's exact type, collectives traced for another axis name or size,
  // nesting deeper than kMaxNestingDepth, or simulated compute in either
  // function.
  absl::StatusOr<int32_t> While(std::shared_ptr<const FunctionIr> cond,
                                std::shared_ptr<const FunctionIr> body,
                                absl::Span<const int32_t> operands, int32_t num_carries);

  // While, then one GetElement per carry: the values of the final carries.
  absl::StatusOr<std::vector<int32_t>> WhileResults(std::shared_ptr<const FunctionIr> cond,
                                                    std::shared_ptr<const FunctionIr> body,
                                                    absl::Span<const int32_t> operands,
                                                    int32_t num_carries);

  // Element `index` of tuple value `tuple`; InvalidArgument if `tuple` is no
  // tuple or `index` is out of range.
  absl::StatusOr<int32_t> GetElement(int32_t tuple, int64_t index);

  // One GetElement per element of tuple value `tuple`, in order.
  absl::StatusOr<std::vector<int32_t>> Elements(int32_t tuple);

  // Scan, then one GetElement per result: the values of the final carries,
  // then the stacked ys.
  absl::StatusOr<std::vector<int32_t>> ScanResults(std::shared_ptr<const FunctionIr> body,
                                                   absl::Span<const int32_t> operands,
                                                   int32_t num_carries, int32_t num_xs,
                                                   int64_t length, bool reverse);

  // --- Linear algebra ---

  // The singular value decomposition of each matrix of the last two dims of
  // `x` (float32 or float64, rank >= 2, [..., m, n]): the tuple (u, s, vt)
  // with x = u diag(s) vt, s descending and k = min(m, n): u [..., m, k], s
  // [..., k], vt [..., k, n]; u [..., m, m] and vt [..., n, n] when
  // `full_matrices`. A matrix with a NaN or inf gets NaN in all three.
  // InvalidArgument for another dtype, a rank below 2 or a dimension beyond
  // int32.
  absl::StatusOr<int32_t> Svd(int32_t x, bool full_matrices);
  // Svd, then its three elements' values (u, s, vt).
  absl::StatusOr<std::vector<int32_t>> SvdResults(int32_t x, bool full_matrices);

  // The LU decomposition with partial pivoting of each square matrix of the
  // last two dims of `x` (float32 or float64): the tuple (lu, pivots,
  // permutation) with x[..., permutation, :] = L U, L unit lower triangular
  // (below lu's diagonal), U upper (on and above it); pivots [..., n] and
  // permutation [..., n] int32 (pivots as LAPACK's ipiv, from 0). A singular
  // matrix factors (U has a zero on its diagonal). InvalidArgument for
  // another dtype, a rank below 2, matrices that are not square or beyond
  // int32 dimensions.
  absl::StatusOr<int32_t> Lu(int32_t x);
  // Lu, then its three elements' values.
  absl::StatusOr<std::vector<int32_t>> LuResults(int32_t x);

  // x with op(a) x = b for each matrix of the last two dims: a [..., n, n]
  // triangular (`lower`, or upper; ones taken for its diagonal when
  // `unit_diagonal`; the other triangle is not read), b [..., n, k] with a's
  // batch dims and dtype (float32 or float64), op(a) a^T when `transpose_a`.
  // A zero on a's diagonal gives infinities or NaN, as BLAS's trsm.
  // InvalidArgument for other dtypes or shapes.
  absl::StatusOr<int32_t> TriangularSolve(int32_t a, int32_t b, bool lower, bool unit_diagonal,
                                          bool transpose_a);

  // The eigendecomposition of the symmetric matrices whose lower triangles
  // are those of `x` (float32 or float64, square [..., n, n]; the upper
  // triangle is not read): the tuple (w [..., n], ascending; v [..., n, n],
  // the eigenvectors as columns), NaN for a matrix with a NaN or inf.
  // InvalidArgument as Lu.
  absl::StatusOr<int32_t> Eigh(int32_t x);
  // Eigh, then its two elements' values (w, v).
  absl::StatusOr<std::vector<int32_t>> EighResults(int32_t x);

  // The Cholesky factors L (lower triangular, L L^T = x, zeros above the
  // diagonal) of the symmetric matrices whose lower triangles are those of
  // `x` (float32 or float64, square [..., n, n]); NaN for a matrix that is
  // not positive definite. InvalidArgument as Lu.
  absl::StatusOr<int32_t> Cholesky(int32_t x);

  // The QR decomposition of each matrix of the last two dims of `x`
  // (float32 or float64, [..., m, n]): the tuple (q, r) with x = q r, q's
  // columns orthonormal, r upper triangular; q [..., m, k] and r [..., k, n]
  // for k = min(m, n), or q [..., m, m] and r [..., m, n] when
  // `full_matrices` (numpy's mode "complete"). NaN for a matrix with a NaN
  // or inf. InvalidArgument as Svd.
  absl::StatusOr<int32_t> Qr(int32_t x, bool full_matrices);
  // Qr, then its two elements' values (q, r).
  absl::StatusOr<std::vector<int32_t>> QrResults(int32_t x, bool full_matrices);

  // The axis size declared by SetAxisSize (0: none). The builder must not be
  // built yet.
  int64_t axis_size() const { return ir_->axis_size_; }

  // The type of value `v`. `v` must be a value of this builder, which must
  // not be built yet.
  const ValueType& type(int32_t v) const { return ir_->ops_[v].type; }
  // The number of values so far; 0 once built.
  int num_values() const { return ir_ == nullptr ? 0 : static_cast<int>(ir_->ops_.size()); }
  // Whether Build succeeded: the builder holds nothing any more.
  bool built() const { return ir_ == nullptr; }

  // Finishes the function with the given outputs (at least one). The builder
  // must not be used afterwards.
  absl::StatusOr<std::shared_ptr<const FunctionIr>> Build(absl::Span<const int32_t> outputs);

 private:
  // OK if `v` is an array value of this builder (a tuple only get_element
  // reads, which checks with `tuple_ok`).
  absl::Status CheckValue(int32_t v, absl::string_view op, bool tuple_ok = false) const;
  absl::Status CheckAxisName(absl::string_view op, absl::string_view axis_name) const;
  // The axis `axis` of a rank-`rank` value, negative counting from the end;
  // InvalidArgument names `op` and `type` when out of range.
  absl::StatusOr<int64_t> NormalizeAxis(absl::string_view op, int64_t axis, int64_t rank,
                                        const ValueType& type) const;
  // Adds `kind` over `operands` (already converted) with result `type`.
  absl::StatusOr<int32_t> AddOp(OpKind kind, absl::InlinedVector<int32_t, 2> operands, ValueType type);
  // Convert without the reuse of widened bfloat16 values.
  absl::StatusOr<int32_t> ConvertUncached(int32_t x, DType dtype);
  // A float32 value computed for a bfloat16 op, rounded back to bfloat16 (a
  // bool value, from a comparison, as it is); errors pass through.
  absl::StatusOr<int32_t> RoundToBF16(absl::StatusOr<int32_t> computed);
  // OK if nested function `f`, the `role` ("body", "cond") of loop `label`,
  // fits in this function: not nested too deep, and its collectives (if
  // any) over this function's axis name and size.
  absl::Status CheckNested(const std::string& label, absl::string_view role,
                           const FunctionIr& f) const;
  // OK if nested function `f` takes exactly the types in `expected`, whose
  // operand `i` `role(i)` names ("carry 0", "const 1").
  absl::Status CheckNestedParams(const std::string& label, absl::string_view what,
                                 const FunctionIr& f, absl::Span<const ValueType> expected,
                                 absl::FunctionRef<std::string(int64_t)> role) const;
  // Appends `op`; InvalidArgument naming the op if its result's size is
  // invalid (CheckedNumBytes): every op's result is checked here.
  absl::StatusOr<int32_t> Add(Op op);
  std::unique_ptr<FunctionIr> ir_;
  // Per bfloat16 value (by index; -1 or past the end: none yet), its
  // float32 convert, which every later op on it reads.
  std::vector<int32_t> widened_;
};

}  // namespace pw

#endif  // PATHWAYS_FUNCTION_IR_FUNCTION_IR_H_
