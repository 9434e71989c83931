#include "csrc/function_ir/function_ir.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "csrc/base/error_kind.h"
#include "csrc/base/status_macros.h"

namespace pw {
namespace {

// Elements of a non-scalar constant shown by ToText before "...".
constexpr int64_t kMaxPrintedElements = 4;

// Shortest text that reads back as the same value, so IR dumps are exact
// without printing 17 digits for every 0.1.
template <typename T>
std::string Shortest(T value) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : "?";
}

template <typename T>
std::string FormatElement(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return Shortest(value);
}

// The fewest significant digits that read back (through float32, as
// ml_dtypes reads them) as the same bfloat16: "0.1" for bfloat16(0.1), whose
// float32 value would print as 0.10009766.
template <>
std::string FormatElement<BFloat16>(const uint8_t* p) {
  BFloat16 value;
  std::memcpy(&value.bits, p, 2);
  const float f = BFloat16ToFloat(value);
  if (std::isnan(f)) return "nan";  // to_chars' spelling for every NaN
  char buf[64];
  for (int digits = 1; digits <= 9; ++digits) {
    auto [end, ec] =
        std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::general, digits);
    if (ec != std::errc()) break;
    float back = 0;
    if (std::from_chars(buf, end, back).ec == std::errc() && FloatToBFloat16(back) == value) {
      return std::string(buf, end);
    }
  }
  return Shortest(f);
}

constexpr int64_t kMaxSimulatedUs = kMaxSimulatedNs / 1000;

// `ns` in microseconds, exactly: "3000000000", "1.5".
std::string Micros(int64_t ns) {
  std::string text = absl::StrCat(ns / 1000);
  if (const int64_t frac = ns % 1000; frac != 0) {
    std::string digits = absl::StrFormat("%03d", frac < 0 ? -frac : frac);
    digits.erase(digits.find_last_not_of('0') + 1);
    absl::StrAppend(&text, ".", digits);
  }
  return text;
}

std::string FormatLiteral(const Op& op) {
  const int64_t size = DTypeSize(op.type.dtype);
  const int64_t n = op.type.num_elements();
  auto element = [&](int64_t i) {
    const uint8_t* p = op.literal.data() + i * size;
    switch (op.type.dtype) {
      case DType::kF64:
        return FormatElement<double>(p);
      case DType::kI32:
        return FormatElement<int32_t>(p);
      case DType::kU32:
        return FormatElement<uint32_t>(p);
      case DType::kBF16:
        return FormatElement<BFloat16>(p);
      case DType::kBool:
        return std::string(*p != 0 ? "true" : "false");
      case DType::kF32:
        break;
    }
    return FormatElement<float>(p);
  };
  if (op.type.dims.empty()) return element(0);
  std::vector<std::string> parts;
  for (int64_t i = 0; i < std::min(n, kMaxPrintedElements); ++i) parts.push_back(element(i));
  if (n > kMaxPrintedElements) parts.push_back("...");
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

// An op of `kind` over `operands` defining a value of `type`; the caller sets
// its attributes.
Op MakeOp(OpKind kind, absl::InlinedVector<int32_t, 2> operands, ValueType type) {
  Op op;
  op.kind = kind;
  op.operands = std::move(operands);
  op.type = std::move(type);
  return op;
}

std::string ValueName(int32_t v) { return absl::StrCat("%", v); }

bool IsComparison(OpKind kind) { return GetTypeRule(kind) == TypeRule::kComparison; }
bool IsBitwise(OpKind kind) { return GetTypeRule(kind) == TypeRule::kBitwise; }
bool IsShift(OpKind kind) { return GetTypeRule(kind) == TypeRule::kShift; }
bool IsTranscendental(OpKind kind) { return GetTypeRule(kind) == TypeRule::kFloating; }

}  // namespace

bool BroadcastDims(absl::Span<const int64_t> a, absl::Span<const int64_t> b, Dims* out) {
  const size_t rank = std::max(a.size(), b.size());
  Dims dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    // i-th dimension from the right; missing dimensions count as 1.
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) return false;
    dims[rank - 1 - i] = da == 1 ? db : da;
  }
  *out = std::move(dims);
  return true;
}

std::optional<OpKind> OpKindFromName(absl::string_view name) {
  for (const OpInfo& info : kOpRegistry) {
    if (info.name == name) return info.kind;
  }
  return std::nullopt;
}

absl::string_view ReduceKindName(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kMean:
      return "mean";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMin:
      return "min";
    case ReduceKind::kArgmax:
      return "argmax";
  }
  return "unknown";
}

absl::string_view CombinerName(Combiner combiner) {
  switch (combiner) {
    case Combiner::kAdd:
      return "add";
    case Combiner::kMul:
      return "mul";
    case Combiner::kMax:
      return "max";
    case Combiner::kMin:
      return "min";
    case Combiner::kSet:
      return "set";
  }
  return "unknown";
}

bool FunctionIr::has_collectives() const {
  return std::any_of(ops_.begin(), ops_.end(), [](const Op& op) {
    return IsCollectiveOp(op.kind) || (op.body != nullptr && op.body->has_collectives()) ||
           (op.cond != nullptr && op.cond->has_collectives());
  });
}

std::string FunctionIr::ToText() const {
  std::string text;
  AppendText(&text, 0);
  return text;
}

void FunctionIr::AppendText(std::string* out, int indent) const {
  const std::string pad(static_cast<size_t>(indent), ' ');
  std::string& text = *out;
  std::vector<std::string> params;
  for (int32_t p : params_) {
    params.push_back(absl::StrCat(ValueName(p), ": ", ops_[p].type.ToString()));
  }
  absl::StrAppend(&text, pad, "func @", name_, "(", absl::StrJoin(params, ", "), ")");
  if (!axis_name_.empty()) absl::StrAppend(&text, " axis=", axis_name_);
  if (axis_size_ > 0) absl::StrAppend(&text, " axis_size=", axis_size_);
  absl::StrAppend(&text, " {\n");
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (op.kind == OpKind::kParameter) continue;  // listed in the signature
    absl::StrAppend(&text, pad, "  ", ValueName(static_cast<int32_t>(i)), " = ");
    if (op.kind == OpKind::kConstant) {
      absl::StrAppend(&text, "const ", op.type.ToString(), " ", FormatLiteral(op), "\n");
      continue;
    }
    if (op.kind == OpKind::kReduce) {
      absl::StrAppend(&text, ReduceKindName(op.reduce_kind), "[axes=(",
                      absl::StrJoin(op.axes, ","), ")",
                      op.keepdims ? ",keepdims" : "", "]");
    } else {
      absl::StrAppendFormat(&text, "%s", OpKindName(op.kind));
    }
    if (IsCollectiveOp(op.kind)) absl::StrAppend(&text, "[", op.axis_name, "]");
    switch (op.kind) {
      case OpKind::kAllGather:
      case OpKind::kConcatenate:
      case OpKind::kTake:
      case OpKind::kPsumScatter:
        absl::StrAppend(&text, "[axis=", op.axis, "]");
        break;
      case OpKind::kScatter:
        absl::StrAppend(&text, "[", CombinerName(op.combiner), ",axis=", op.axis, "]");
        break;
      case OpKind::kCumulative:
        absl::StrAppend(&text, "[", CombinerName(op.combiner), ",axis=", op.axis,
                        op.reverse ? ",reverse" : "", "]");
        break;
      case OpKind::kTopK:
        absl::StrAppend(&text, "[k=", op.type.dims.back(), "]");
        break;
      case OpKind::kSort:
        if (op.reverse) absl::StrAppend(&text, "[descending]");
        break;
      case OpKind::kAllToAll:
        absl::StrAppend(&text, "[split=", op.axis, ",concat=", op.concat_axis, "]");
        break;
      case OpKind::kTranspose:
        absl::StrAppend(&text, "[perm=(", absl::StrJoin(op.axes, ","), ")]");
        break;
      case OpKind::kRev:
        absl::StrAppend(&text, "[axes=(", absl::StrJoin(op.axes, ","), ")]");
        break;
      case OpKind::kSlice:
        absl::StrAppend(&text, "[start=(", absl::StrJoin(op.slice_start, ","), "),limit=(",
                        absl::StrJoin(op.slice_limit, ","), "),step=(",
                        absl::StrJoin(op.slice_step, ","), ")]");
        break;
      case OpKind::kPad:
        absl::StrAppend(&text, "[lo=(", absl::StrJoin(op.pad_lo, ","), "),hi=(",
                        absl::StrJoin(op.pad_hi, ","), "),interior=(",
                        absl::StrJoin(op.pad_interior, ","), ")]");
        break;
      case OpKind::kScan:
        absl::StrAppend(&text, "[length=", op.length, ",carries=", op.num_carries,
                        ",xs=", op.num_xs, op.reverse ? ",reverse" : "", "]");
        break;
      case OpKind::kWhile:
        absl::StrAppend(&text, "[carries=", op.num_carries, "]");
        break;
      case OpKind::kGetElement:
        absl::StrAppend(&text, "[", op.index, "]");
        break;
      case OpKind::kSvd:
      case OpKind::kQr:
        if (op.full_matrices) absl::StrAppend(&text, "[full_matrices]");
        break;
      case OpKind::kTriangularSolve:
        absl::StrAppend(&text, "[", op.lower ? "lower" : "upper",
                        op.unit_diagonal ? ",unit_diagonal" : "",
                        op.transpose_a ? ",transpose_a" : "", "]");
        break;
      default:
        break;
    }
    if (op.kind == OpKind::kPpermute) {
      absl::StrAppend(&text, "[sources=(", absl::StrJoin(op.perm_source, ","), ")]");
    }
    if (op.kind == OpKind::kSimulatedCompute) absl::StrAppend(&text, "[", op.duration_ns / 1000.0, "us]");
    absl::StrAppend(&text, " ",
                    absl::StrJoin(op.operands, ", ", [](std::string* o, int32_t v) {
                      absl::StrAppend(o, ValueName(v));
                    }));
    absl::StrAppend(&text, " : ", op.type.ToString());
    if (IsLoopOp(op.kind)) {
      // The nested functions once, however many times they run.
      absl::StrAppend(&text, " {\n");
      if (op.cond != nullptr) op.cond->AppendText(out, indent + 4);
      op.body->AppendText(out, indent + 4);
      absl::StrAppend(&text, pad, "  }");
    }
    absl::StrAppend(&text, "\n");
  }
  absl::StrAppend(&text, pad, "  return ",
                  absl::StrJoin(outputs_, ", ",
                                [](std::string* o, int32_t v) {
                                  absl::StrAppend(o, ValueName(v));
                                }),
                  "\n", pad, "}\n");
}

FunctionBuilder::FunctionBuilder(std::string name, std::string axis_name)
    : ir_(std::make_unique<FunctionIr>()) {
  ir_->name_ = std::move(name);
  ir_->axis_name_ = std::move(axis_name);
}

absl::Status FunctionBuilder::CheckValue(int32_t v, absl::string_view op, bool tuple_ok) const {
  if (ir_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: the function builder was already built", op));
  }
  if (v < 0 || v >= num_values()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: operand %%%d is not a value of this function", op, v));
  }
  if (!tuple_ok && type(v).is_tuple()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: operand %%%d is the %s tuple %s; take its elements with get_element", op, v,
        OpKindName(ir_->ops_[v].kind), type(v).ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> FunctionBuilder::Add(Op op) {
  if (op.type.is_tuple()) {
    for (const ValueType& e : op.type.elements) {
      PW_RETURN_IF_ERROR(CheckedNumBytes(OpKindName(op.kind), e.dtype, e.dims).status());
    }
  } else {
    PW_RETURN_IF_ERROR(
        CheckedNumBytes(OpKindName(op.kind), op.type.dtype, op.type.dims).status());
  }
  ir_->ops_.push_back(std::move(op));
  return static_cast<int32_t>(ir_->ops_.size() - 1);
}

int32_t FunctionBuilder::Parameter(DType dtype, Dims dims) {
  // Built in place: moving an Op with no operands trips GCC's
  // -Wuninitialized on absl::InlinedVector's inline storage.
  Op& op = ir_->ops_.emplace_back();
  op.kind = OpKind::kParameter;
  op.type = ValueType{dtype, std::move(dims)};
  op.param_index = static_cast<int32_t>(ir_->params_.size());
  const int32_t v = num_values() - 1;
  ir_->params_.push_back(v);
  return v;
}

absl::StatusOr<int32_t> FunctionBuilder::Constant(DType dtype, Dims dims,
                                                  absl::Span<const uint8_t> bytes) {
  if (ir_ == nullptr) return absl::FailedPreconditionError("constant: builder already built");
  PW_ASSIGN_OR_RETURN(const int64_t expected, CheckedNumBytes("constant", dtype, dims));
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "constant: %s needs %d bytes, got %d", TypeToString(dtype, dims), expected,
        bytes.size()));
  }
  if (dtype == DType::kBool) {
    // The kernels read these bytes as C++ bools, for which any other value
    // is undefined behaviour.
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] > 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "constant: element %d of %s is %d; a bool is 0 or 1", i,
            TypeToString(dtype, dims), bytes[i]));
      }
    }
  }
  Op& op = ir_->ops_.emplace_back();  // in place, as in Parameter()
  op.kind = OpKind::kConstant;
  op.type = ValueType{dtype, std::move(dims)};
  op.literal.assign(bytes.begin(), bytes.end());
  return num_values() - 1;
}

namespace {

// Element i of a literal of `dtype`, as a double (exact for every dtype).
double LiteralElement(const std::vector<uint8_t>& literal, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF64: {
      double v;
      std::memcpy(&v, literal.data() + i * 8, 8);
      return v;
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, literal.data() + i * 4, 4);
      return v;
    }
    case DType::kU32: {
      uint32_t v;
      std::memcpy(&v, literal.data() + i * 4, 4);
      return v;
    }
    case DType::kBF16: {
      BFloat16 v;
      std::memcpy(&v.bits, literal.data() + i * 2, 2);
      return BFloat16ToFloat(v);
    }
    case DType::kBool:
      return literal[i] != 0 ? 1.0 : 0.0;
    case DType::kF32:
      break;
  }
  float v;
  std::memcpy(&v, literal.data() + i * 4, 4);
  return v;
}

// `literal` (of `from`) cast to `to`, with the kernels' rules (kernel_util.h's
// ToInt32 and ToUint32, bfloat16.h): to bool is != 0; float to int32
// truncates, NaN and out-of-range giving INT32_MIN; to uint32 truncates and
// saturates (NaN giving 0); between integers modulo 2^32; to bfloat16
// through float32 (exact from bfloat16, so the double `v` loses nothing).
std::vector<uint8_t> ConvertLiteral(const std::vector<uint8_t>& literal, DType from, DType to,
                                    int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(n * DTypeSize(to)));
  for (int64_t i = 0; i < n; ++i) {
    const double v = LiteralElement(literal, from, i);
    if (IsInteger(from) && IsInteger(to)) {  // the same bits
      std::memcpy(out.data() + i * 4, literal.data() + i * 4, 4);
      continue;
    }
    switch (to) {
      case DType::kF64:
        std::memcpy(out.data() + i * 8, &v, 8);
        break;
      case DType::kF32: {
        const float f = static_cast<float>(v);
        std::memcpy(out.data() + i * 4, &f, 4);
        break;
      }
      case DType::kI32: {
        const int32_t k = (v >= -2147483648.0 && v < 2147483648.0)
                              ? static_cast<int32_t>(v)
                              : std::numeric_limits<int32_t>::min();
        std::memcpy(out.data() + i * 4, &k, 4);
        break;
      }
      case DType::kU32: {
        const uint32_t k = !(v > 0) ? 0u : v >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(v);
        std::memcpy(out.data() + i * 4, &k, 4);
        break;
      }
      case DType::kBF16: {
        const BFloat16 h = FloatToBFloat16(static_cast<float>(v));
        std::memcpy(out.data() + i * 2, &h.bits, 2);
        break;
      }
      case DType::kBool:
        out[i] = v != 0.0 ? 1 : 0;
        break;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<int32_t> FunctionBuilder::Convert(int32_t x, DType dtype) {
  PW_RETURN_IF_ERROR(CheckValue(x, OpKindName(OpKind::kConvert)));
  if (type(x).dtype == dtype) return x;
  // Every op on a bfloat16 value widens it: one convert per value serves
  // them all (the conversion is exact, so sharing it changes no result).
  const bool widen = type(x).dtype == DType::kBF16 && dtype == DType::kF32;
  if (widen && static_cast<size_t>(x) < widened_.size() && widened_[x] >= 0) return widened_[x];
  PW_ASSIGN_OR_RETURN(const int32_t converted, ConvertUncached(x, dtype));
  if (widen) {
    if (widened_.size() <= static_cast<size_t>(x)) widened_.resize(x + 1, -1);
    widened_[x] = converted;
  }
  return converted;
}

absl::StatusOr<int32_t> FunctionBuilder::ConvertUncached(int32_t x, DType dtype) {
  if (ir_->ops_[x].kind == OpKind::kConstant) {  // folded: a constant of the new dtype
    const Op& c = ir_->ops_[x];
    Dims dims = c.type.dims;
    std::vector<uint8_t> literal =
        ConvertLiteral(c.literal, c.type.dtype, dtype, c.type.num_elements());
    Op& op = ir_->ops_.emplace_back();  // in place, as in Parameter(); `c` is stale now
    op.kind = OpKind::kConstant;
    op.type = ValueType{dtype, std::move(dims)};
    op.literal = std::move(literal);
    return num_values() - 1;
  }
  Op op = MakeOp(OpKind::kConvert, {x}, ValueType{dtype, type(x).dims});
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::BitcastConvert(int32_t x, DType dtype) {
  const absl::string_view name = OpKindName(OpKind::kBitcastConvert);
  PW_RETURN_IF_ERROR(CheckValue(x, name));
  const ValueType tx = type(x);
  if (tx.dtype == DType::kBool || dtype == DType::kBool ||
      DTypeSize(tx.dtype) != DTypeSize(dtype)) {
    return UnsupportedTypeError(absl::StrFormat(
        "%s: %s to %s: needs two of float32, int32 and uint32 (the same width, not bool)", name,
        tx.ToString(), DTypeName(dtype)));
  }
  if (tx.dtype == dtype) return x;
  return AddOp(OpKind::kBitcastConvert, {x}, ValueType{dtype, tx.dims});
}

absl::StatusOr<int32_t> FunctionBuilder::AddOp(OpKind kind, absl::InlinedVector<int32_t, 2> operands,
                                               ValueType type) {
  return Add(MakeOp(kind, std::move(operands), std::move(type)));
}

absl::StatusOr<int32_t> FunctionBuilder::RoundToBF16(absl::StatusOr<int32_t> computed) {
  if (!computed.ok()) return computed;
  if (type(*computed).dtype != DType::kF32) return computed;  // a comparison's bools
  return Convert(*computed, DType::kBF16);
}

absl::StatusOr<int32_t> FunctionBuilder::Binary(OpKind kind, int32_t a, int32_t b) {
  if (!IsBinaryOp(kind)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("binary: %s is not a binary op", OpKindName(kind)));
  }
  const absl::string_view name = OpKindName(kind);
  PW_RETURN_IF_ERROR(CheckValue(a, name));
  PW_RETURN_IF_ERROR(CheckValue(b, name));
  // Copies: adding converts below may reallocate ops_.
  const ValueType ta = type(a);
  const ValueType tb = type(b);
  Dims dims;
  if (!BroadcastDims(ta.dims, tb.dims, &dims)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: incompatible shapes %s and %s", name, ta.ToString(), tb.ToString()));
  }
  if (IsBitwise(kind) && (IsFloat(ta.dtype) || IsFloat(tb.dtype))) {
    return UnsupportedTypeError(absl::StrFormat(
        "%s: operands must be bool or integers, got %s and %s", name, ta.ToString(),
        tb.ToString()));
  }
  if (IsShift(kind) && (IsFloat(ta.dtype) || IsFloat(tb.dtype))) {
    return UnsupportedTypeError(absl::StrFormat(
        "%s: operands must be integers, got %s and %s", name, ta.ToString(), tb.ToString()));
  }
  DType dtype = PromoteTypes(ta.dtype, tb.dtype);
  if (dtype == DType::kBF16) {
    // An integer or bool operand becomes bfloat16 first (its rounding is
    // part of JAX's promotion), then both are computed on in float32.
    PW_ASSIGN_OR_RETURN(a, Convert(a, DType::kBF16));
    PW_ASSIGN_OR_RETURN(b, Convert(b, DType::kBF16));
    PW_ASSIGN_OR_RETURN(a, Convert(a, DType::kF32));
    PW_ASSIGN_OR_RETURN(b, Convert(b, DType::kF32));
    const DType computed = IsComparison(kind) ? DType::kBool : DType::kF32;
    return RoundToBF16(AddOp(kind, {a, b}, ValueType{computed, std::move(dims)}));
  }
  if (dtype == DType::kBool && kind == OpKind::kSub) {
    return UnsupportedTypeError(absl::StrFormat(
        "sub: boolean subtract is not supported (%s and %s); use logical_xor", ta.ToString(),
        tb.ToString()));
  }
  // True division of integers is in float64, as numpy; bool ** bool and the
  // remainder of bools in int32.
  if (kind == OpKind::kDiv && !IsFloat(dtype)) dtype = DType::kF64;
  // atan2 of integers computes in float64, of bools in float32, as the
  // unary transcendental functions.
  if (kind == OpKind::kAtan2 && !IsFloat(dtype)) dtype = dtype == DType::kBool ? DType::kF32 : DType::kF64;
  if ((kind == OpKind::kPow || kind == OpKind::kRem || IsShift(kind)) && dtype == DType::kBool) {
    dtype = DType::kI32;
  }
  // int32 with uint32 promotes to int32 (JAX's lattice without int64), which
  // wraps uint32 values above 2^31; a comparison must not, so it compares in
  // float64, exact for every 32-bit integer (numpy compares in int64).
  if (IsComparison(kind) && ta.dtype != tb.dtype && IsInteger(ta.dtype) && IsInteger(tb.dtype)) {
    dtype = DType::kF64;
  }
  PW_ASSIGN_OR_RETURN(a, Convert(a, dtype));
  PW_ASSIGN_OR_RETURN(b, Convert(b, dtype));
  const DType result = IsComparison(kind) ? DType::kBool : dtype;
  return AddOp(kind, {a, b}, ValueType{result, std::move(dims)});
}

absl::StatusOr<int32_t> FunctionBuilder::Unary(OpKind kind, int32_t x) {
  if (!IsUnaryOp(kind)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unary: %s is not a unary op", OpKindName(kind)));
  }
  const absl::string_view name = OpKindName(kind);
  PW_RETURN_IF_ERROR(CheckValue(x, name));
  const ValueType tx = type(x);
  const TypeRule rule = GetTypeRule(kind);
  if (rule == TypeRule::kInvert && IsFloat(tx.dtype)) {
    return UnsupportedTypeError(
        absl::StrFormat("%s: operand must be bool or an integer, got %s", name, tx.ToString()));
  }
  if (kind == OpKind::kNeg && tx.dtype == DType::kBool) {
    return UnsupportedTypeError(absl::StrFormat(
        "neg: negative of a bool is not supported (%s); use logical_not", tx.ToString()));
  }
  if (IsTranscendental(kind) && !IsFloat(tx.dtype)) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, IsInteger(tx.dtype) ? DType::kF64 : DType::kF32));
  }
  if (tx.dtype == DType::kBF16) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));
    return RoundToBF16(AddOp(kind, {x}, type(x)));
  }
  return AddOp(kind, {x}, type(x));
}

absl::StatusOr<int32_t> FunctionBuilder::Select(int32_t cond, int32_t x, int32_t y) {
  const absl::string_view name = OpKindName(OpKind::kSelect);
  PW_RETURN_IF_ERROR(CheckValue(cond, name));
  PW_RETURN_IF_ERROR(CheckValue(x, name));
  PW_RETURN_IF_ERROR(CheckValue(y, name));
  const ValueType tc = type(cond);
  const ValueType tx = type(x);
  const ValueType ty = type(y);
  Dims xy;
  Dims dims;
  if (!BroadcastDims(tx.dims, ty.dims, &xy) || !BroadcastDims(tc.dims, xy, &dims)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("select: incompatible shapes %s, %s and %s", tc.ToString(),
                        tx.ToString(), ty.ToString()));
  }
  if (tc.dtype != DType::kBool) {
    return UnsupportedTypeError(absl::StrFormat("select: condition must be bool, got %s", tc.ToString()));
  }
  const DType dtype = PromoteTypes(tx.dtype, ty.dtype);
  PW_ASSIGN_OR_RETURN(x, Convert(x, dtype));
  PW_ASSIGN_OR_RETURN(y, Convert(y, dtype));
  return AddOp(OpKind::kSelect, {cond, x, y}, ValueType{dtype, std::move(dims)});
}

absl::Status FunctionBuilder::CheckAxisName(absl::string_view op,
                                            absl::string_view axis_name) const {
  if (axis_name.empty() || axis_name != ir_->axis_name_) {
    return UnboundNameError(
        ir_->axis_name_.empty()
            ? absl::StrFormat("%s: unbound axis name '%s' (this function has no pmap "
                              "axis name)",
                              op, axis_name)
            : absl::StrFormat("%s: unbound axis name '%s' (bound: '%s')", op, axis_name,
                              ir_->axis_name_));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> FunctionBuilder::Psum(int32_t x, absl::string_view axis_name) {
  PW_RETURN_IF_ERROR(CheckValue(x, OpKindName(OpKind::kPsum)));
  PW_RETURN_IF_ERROR(CheckAxisName("psum", axis_name));
  // Sums of bools count, as numpy's sum of a bool array.
  if (type(x).dtype == DType::kBool) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kI32));
  }
  const bool bf16 = type(x).dtype == DType::kBF16;
  if (bf16) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));  // summed in float32, rounded once
  }
  Op op = MakeOp(OpKind::kPsum, {x}, type(x));
  op.axis_name = std::string(axis_name);
  return bf16 ? RoundToBF16(Add(std::move(op))) : Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Pcollective(OpKind kind, int32_t x,
                                                     absl::string_view axis_name) {
  if (kind != OpKind::kPmean && kind != OpKind::kPmax && kind != OpKind::kPmin) {
    return absl::InvalidArgumentError(
        absl::StrFormat("collective: %s is not pmean, pmax or pmin", OpKindName(kind)));
  }
  const absl::string_view name = OpKindName(kind);
  PW_RETURN_IF_ERROR(CheckValue(x, name));
  PW_RETURN_IF_ERROR(CheckAxisName(name, axis_name));
  if (kind == OpKind::kPmean && type(x).dtype == DType::kBool) {
    return UnsupportedTypeError(
        absl::StrFormat("pmean: operand must be numeric, got %s", type(x).ToString()));
  }
  const bool bf16 = type(x).dtype == DType::kBF16;
  if (bf16) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));
  }
  Op op = MakeOp(kind, {x}, type(x));
  op.axis_name = std::string(axis_name);
  return bf16 ? RoundToBF16(Add(std::move(op))) : Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::AxisIndex(absl::string_view axis_name) {
  if (ir_ == nullptr) return absl::FailedPreconditionError("axis_index: builder already built");
  PW_RETURN_IF_ERROR(CheckAxisName("axis_index", axis_name));
  Op& op = ir_->ops_.emplace_back();  // in place, as in Parameter()
  op.kind = OpKind::kAxisIndex;
  op.type.dtype = DType::kI32;
  op.axis_name = std::string(axis_name);
  return num_values() - 1;
}

absl::StatusOr<int32_t> FunctionBuilder::Reduce(ReduceKind kind, int32_t x,
                                                const std::vector<int64_t>* axes,
                                                bool keepdims) {
  const absl::string_view name = ReduceKindName(kind);
  PW_RETURN_IF_ERROR(CheckValue(x, name));
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  std::vector<bool> reduced(rank, axes == nullptr);
  if (axes != nullptr) {
    if (kind == ReduceKind::kArgmax && axes->size() != 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "argmax: takes a single axis or none, got %d axes for %s", axes->size(),
          tx.ToString()));
    }
    for (int64_t a : *axes) {
      if (a < -rank || a >= rank) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: axis %d is out of range for %s", name, a, tx.ToString()));
      }
      const int64_t k = a < 0 ? a + rank : a;
      if (reduced[k]) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: axis %d is repeated for %s", name, a, tx.ToString()));
      }
      reduced[k] = true;
    }
  }
  std::vector<int64_t> red_axes;
  Dims dims;
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) {
      red_axes.push_back(d);
      count *= tx.dims[d];
      if (keepdims) dims.push_back(1);
    } else {
      dims.push_back(tx.dims[d]);
    }
  }
  if (count == 0 && kind != ReduceKind::kSum && kind != ReduceKind::kMean) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: zero-size reduction of %s has no identity", name, tx.ToString()));
  }
  DType dtype = tx.dtype;
  if (kind == ReduceKind::kSum && dtype == DType::kBool) dtype = DType::kI32;
  if (kind == ReduceKind::kMean && !IsFloat(dtype)) dtype = DType::kF64;
  // bfloat16 accumulates in float32 and rounds once, as XLA's reductions.
  const bool bf16 = dtype == DType::kBF16;
  if (bf16) dtype = DType::kF32;
  PW_ASSIGN_OR_RETURN(x, Convert(x, dtype));
  const DType result = kind == ReduceKind::kArgmax ? DType::kI32 : dtype;
  Op op = MakeOp(OpKind::kReduce, {x}, ValueType{result, std::move(dims)});
  op.reduce_kind = kind;
  op.axes = std::move(red_axes);
  op.keepdims = keepdims;
  if (bf16 && kind != ReduceKind::kArgmax) return RoundToBF16(Add(std::move(op)));
  return Add(std::move(op));
}

absl::Status FunctionBuilder::SetAxisSize(int64_t n) {
  if (ir_ == nullptr) return absl::FailedPreconditionError("set_axis_size: builder already built");
  if (n < 1 || n > kMaxAxisSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("set_axis_size: needs 1 <= n <= ", kMaxAxisSize, " (the most devices a gang has), got ", n));
  }
  ir_->axis_size_ = n;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> FunctionBuilder::AllGather(int32_t x, absl::string_view axis_name,
                                                   int64_t axis) {
  PW_RETURN_IF_ERROR(CheckValue(x, "all_gather"));
  PW_RETURN_IF_ERROR(CheckAxisName("all_gather", axis_name));
  if (ir_->axis_size_ < 1) {
    return absl::FailedPreconditionError(
        "all_gather: the number of shards is unknown (FunctionBuilder::SetAxisSize)");
  }
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  if (axis < -rank - 1 || axis > rank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "all_gather: axis %d is out of range for %s (result rank %d)", axis, tx.ToString(),
        rank + 1));
  }
  const int64_t a = axis < 0 ? axis + rank + 1 : axis;
  Dims dims = tx.dims;
  dims.insert(dims.begin() + a, ir_->axis_size_);
  Op op = MakeOp(OpKind::kAllGather, {x}, ValueType{tx.dtype, std::move(dims)});
  op.axis_name = std::string(axis_name);
  op.axis = a;
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Ppermute(
    int32_t x, absl::string_view axis_name,
    const std::vector<std::pair<int64_t, int64_t>>& perm) {
  PW_RETURN_IF_ERROR(CheckValue(x, "ppermute"));
  PW_RETURN_IF_ERROR(CheckAxisName("ppermute", axis_name));
  const int64_t n = ir_->axis_size_;
  if (n < 1) {
    return absl::FailedPreconditionError(
        "ppermute: the number of shards is unknown (FunctionBuilder::SetAxisSize)");
  }
  std::vector<int64_t> source(n, -1);
  std::vector<bool> used(n, false);
  for (const auto& [src, dst] : perm) {
    if (src < 0 || src >= n || dst < 0 || dst >= n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ppermute: perm pair (%d, %d) is out of range for %d shards", src, dst, n));
    }
    if (used[src] || source[dst] >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ppermute: perm pair (%d, %d) repeats a source or destination", src, dst));
    }
    used[src] = true;
    source[dst] = src;
  }
  Op op = MakeOp(OpKind::kPpermute, {x}, type(x));
  op.axis_name = std::string(axis_name);
  op.perm_source = std::move(source);
  return Add(std::move(op));
}

absl::StatusOr<int64_t> FunctionBuilder::NormalizeAxis(absl::string_view op, int64_t axis,
                                                        int64_t rank,
                                                        const ValueType& type) const {
  if (axis < -rank || axis >= rank) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: axis %d is out of range for %s", op, axis, type.ToString()));
  }
  return axis < 0 ? axis + rank : axis;
}

namespace {

std::string DimsString(absl::Span<const int64_t> dims) {
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

// An error unless `v` has one entry per dimension of `t`.
absl::Status CheckPerDim(absl::string_view op, absl::string_view what,
                         const std::vector<int64_t>& v, const ValueType& t) {
  if (v.size() != t.dims.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s has %d entries for %s of rank %d", op, what, v.size(), t.ToString(),
        t.dims.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int32_t> FunctionBuilder::Copy(int32_t x) {
  PW_RETURN_IF_ERROR(CheckValue(x, "copy"));
  return AddOp(OpKind::kCopy, {x}, type(x));
}

absl::StatusOr<int32_t> FunctionBuilder::Reshape(int32_t x, Dims dims) {
  PW_RETURN_IF_ERROR(CheckValue(x, "reshape"));
  const ValueType tx = type(x);
  if (absl::StatusOr<int64_t> bytes = CheckedNumBytes("reshape", tx.dtype, dims);
      !bytes.ok() || *bytes != tx.num_bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "reshape: cannot reshape %s (%d elements) to shape %s", tx.ToString(),
        tx.num_elements(), DimsString(dims)));
  }
  if (dims == tx.dims) return x;
  return AddOp(OpKind::kReshape, {x}, ValueType{tx.dtype, std::move(dims)});
}

absl::StatusOr<int32_t> FunctionBuilder::BroadcastTo(int32_t x, Dims dims) {
  PW_RETURN_IF_ERROR(CheckValue(x, "broadcast_to"));
  const ValueType tx = type(x);
  Dims out;
  if (tx.dims.size() > dims.size() || !BroadcastDims(tx.dims, dims, &out) || out != dims ||
      std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d < 0; })) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "broadcast_to: cannot broadcast %s to shape %s", tx.ToString(), DimsString(dims)));
  }
  if (dims == tx.dims) return x;
  return AddOp(OpKind::kBroadcastTo, {x}, ValueType{tx.dtype, std::move(dims)});
}

absl::StatusOr<int32_t> FunctionBuilder::Transpose(int32_t x, const std::vector<int64_t>& perm) {
  PW_RETURN_IF_ERROR(CheckValue(x, "transpose"));
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  std::vector<int64_t> axes;
  std::vector<bool> seen(rank, false);
  bool ok = static_cast<int64_t>(perm.size()) == rank;
  for (int64_t a : perm) {
    if (!ok) break;
    const int64_t k = a < 0 ? a + rank : a;
    ok = k >= 0 && k < rank && !seen[k];
    if (ok) seen[k] = true;
    axes.push_back(k);
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transpose: axes %s are not a permutation of the %d dimensions of %s",
        DimsString(perm), rank, tx.ToString()));
  }
  bool identity = true;
  Dims dims;
  for (int64_t d = 0; d < rank; ++d) {
    identity = identity && axes[d] == d;
    dims.push_back(tx.dims[axes[d]]);
  }
  if (identity) return x;
  Op op = MakeOp(OpKind::kTranspose, {x}, ValueType{tx.dtype, std::move(dims)});
  op.axes = std::move(axes);
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Slice(int32_t x, const std::vector<int64_t>& start,
                                               const std::vector<int64_t>& limit,
                                               const std::vector<int64_t>& step) {
  PW_RETURN_IF_ERROR(CheckValue(x, "slice"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckPerDim("slice", "start", start, tx));
  PW_RETURN_IF_ERROR(CheckPerDim("slice", "limit", limit, tx));
  PW_RETURN_IF_ERROR(CheckPerDim("slice", "step", step, tx));
  Dims dims;
  bool identity = true;
  for (size_t d = 0; d < tx.dims.size(); ++d) {
    if (!(0 <= start[d] && start[d] <= limit[d] && limit[d] <= tx.dims[d] && step[d] >= 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "slice: [%d:%d:%d] is not a valid slice of dimension %d of %s", start[d], limit[d],
          step[d], d, tx.ToString()));
    }
    const int64_t span = limit[d] - start[d];  // no overflow: both in [0, dim]
    dims.push_back(span == 0 ? 0 : 1 + (span - 1) / step[d]);
    identity = identity && dims.back() == tx.dims[d];
  }
  if (identity) return x;
  Op op = MakeOp(OpKind::kSlice, {x}, ValueType{tx.dtype, std::move(dims)});
  op.slice_start = start;
  op.slice_limit = limit;
  op.slice_step = step;
  for (size_t d = 0; d < tx.dims.size(); ++d) {
    // With at most one element taken the step does not matter: stored as 1,
    // so that no stride derived from it can overflow.
    if (op.type.dims[d] <= 1) op.slice_step[d] = 1;
  }
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Rev(int32_t x, const std::vector<int64_t>& axes) {
  PW_RETURN_IF_ERROR(CheckValue(x, "rev"));
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  std::vector<bool> rev(rank, false);
  for (int64_t a : axes) {
    PW_ASSIGN_OR_RETURN(const int64_t k, NormalizeAxis("rev", a, rank, tx));
    if (rev[k]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("rev: axis %d is repeated for %s", a, tx.ToString()));
    }
    rev[k] = true;
  }
  std::vector<int64_t> sorted;
  for (int64_t d = 0; d < rank; ++d) {
    if (rev[d] && tx.dims[d] > 1) sorted.push_back(d);
  }
  if (sorted.empty()) return x;
  Op op = MakeOp(OpKind::kRev, {x}, tx);
  op.axes = std::move(sorted);
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Pad(int32_t x, const std::vector<int64_t>& lo,
                                             const std::vector<int64_t>& hi,
                                             const std::vector<int64_t>& interior) {
  PW_RETURN_IF_ERROR(CheckValue(x, "pad"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckPerDim("pad", "lo", lo, tx));
  PW_RETURN_IF_ERROR(CheckPerDim("pad", "hi", hi, tx));
  PW_RETURN_IF_ERROR(CheckPerDim("pad", "interior", interior, tx));
  Dims dims;
  bool identity = true;
  for (size_t d = 0; d < tx.dims.size(); ++d) {
    if (lo[d] < 0 || hi[d] < 0 || interior[d] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pad: negative padding (%d, %d, interior %d) for dimension %d of %s", lo[d], hi[d],
          interior[d], d, tx.ToString()));
    }
    const int64_t n = tx.dims[d];
    int64_t size = 0;
    if (__builtin_mul_overflow(std::max<int64_t>(n - 1, 0), interior[d], &size) ||
        __builtin_add_overflow(size, n, &size) || __builtin_add_overflow(size, lo[d], &size) ||
        __builtin_add_overflow(size, hi[d], &size)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pad: padding (%d, %d, interior %d) of dimension %d of %s is too large", lo[d], hi[d],
          interior[d], d, tx.ToString()));
    }
    dims.push_back(size);
    identity = identity && dims.back() == n;
  }
  if (identity) return x;
  Op op = MakeOp(OpKind::kPad, {x}, ValueType{tx.dtype, std::move(dims)});
  op.pad_lo = lo;
  op.pad_hi = hi;
  op.pad_interior = interior;
  for (size_t d = 0; d < tx.dims.size(); ++d) {
    if (tx.dims[d] <= 1) op.pad_interior[d] = 0;  // nothing lies between: the same op, with no huge strides
  }
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Concatenate(absl::Span<const int32_t> xs,
                                                     int64_t axis) {
  if (xs.empty()) {
    return absl::InvalidArgumentError("concatenate: needs at least one operand");
  }
  for (int32_t x : xs) PW_RETURN_IF_ERROR(CheckValue(x, "concatenate"));
  const ValueType t0 = type(xs[0]);
  const int64_t rank = static_cast<int64_t>(t0.dims.size());
  if (rank == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "concatenate: zero-dimensional operand %s cannot be concatenated", t0.ToString()));
  }
  PW_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis("concatenate", axis, rank, t0));
  Dims dims = t0.dims;
  dims[a] = 0;
  DType dtype = t0.dtype;
  for (int32_t x : xs) {
    const ValueType& t = type(x);
    bool ok = static_cast<int64_t>(t.dims.size()) == rank;
    for (int64_t d = 0; ok && d < rank; ++d) ok = d == a || t.dims[d] == t0.dims[d];
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "concatenate: %s and %s do not match off axis %d", t0.ToString(), t.ToString(), a));
    }
    dims[a] += t.dims[a];
    dtype = PromoteTypes(dtype, t.dtype);
  }
  if (xs.size() == 1) return xs[0];
  absl::InlinedVector<int32_t, 2> operands;
  for (int32_t x : xs) {
    PW_ASSIGN_OR_RETURN(const int32_t c, Convert(x, dtype));
    operands.push_back(c);
  }
  Op op =
      MakeOp(OpKind::kConcatenate, std::move(operands), ValueType{dtype, std::move(dims)});
  op.axis = a;
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Take(int32_t x, int32_t indices, int64_t axis) {
  PW_RETURN_IF_ERROR(CheckValue(x, "take"));
  PW_RETURN_IF_ERROR(CheckValue(indices, "take"));
  const ValueType tx = type(x);
  const ValueType ti = type(indices);
  if (ti.dtype != DType::kI32) {
    return UnsupportedTypeError(absl::StrFormat("take: indices must be int32, got %s", ti.ToString()));
  }
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  if (rank == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("take: cannot index into zero-dimensional %s", tx.ToString()));
  }
  PW_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis("take", axis, rank, tx));
  if (tx.dims[a] == 0 && ti.num_elements() > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "take: cannot take from empty axis %d of %s", a, tx.ToString()));
  }
  Dims dims(tx.dims.begin(), tx.dims.begin() + a);
  dims.insert(dims.end(), ti.dims.begin(), ti.dims.end());
  dims.insert(dims.end(), tx.dims.begin() + a + 1, tx.dims.end());
  Op op = MakeOp(OpKind::kTake, {x, indices}, ValueType{tx.dtype, std::move(dims)});
  op.axis = a;
  return Add(std::move(op));
}

namespace {

bool IsCombiner(Combiner c) {
  return c == Combiner::kAdd || c == Combiner::kMul || c == Combiner::kMax || c == Combiner::kMin ||
         c == Combiner::kSet;
}

// The dims of a scatter's (or scatter_add's) result, or InvalidArgument
// naming `op` when `updates` and `indices` do not fit at `axis` with `size`.
absl::StatusOr<Dims> ScatterDims(absl::string_view op, const ValueType& tu, const ValueType& ti,
                                 int64_t axis, int64_t size) {
  if (ti.dtype != DType::kI32) {
    return UnsupportedTypeError(
        absl::StrFormat("%s: indices must be int32, got %s", op, ti.ToString()));
  }
  const int64_t irank = static_cast<int64_t>(ti.dims.size());
  const int64_t urank = static_cast<int64_t>(tu.dims.size());
  const bool fits = axis >= 0 && axis <= urank - irank && size >= 0 &&
                    std::equal(ti.dims.begin(), ti.dims.end(), tu.dims.begin() + axis);
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: updates %s do not hold indices %s at axis %d (size %d)", op, tu.ToString(),
        ti.ToString(), axis, size));
  }
  Dims dims(tu.dims.begin(), tu.dims.begin() + axis);
  dims.push_back(size);
  dims.insert(dims.end(), tu.dims.begin() + axis + irank, tu.dims.end());
  return dims;
}

}  // namespace

absl::StatusOr<int32_t> FunctionBuilder::Scatter(Combiner combiner, int32_t operand,
                                                 int32_t indices, int32_t updates, int64_t axis,
                                                 int64_t size) {
  PW_RETURN_IF_ERROR(CheckValue(operand, "scatter"));
  PW_RETURN_IF_ERROR(CheckValue(indices, "scatter"));
  PW_RETURN_IF_ERROR(CheckValue(updates, "scatter"));
  if (!IsCombiner(combiner)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scatter: unknown combiner %d", static_cast<int>(combiner)));
  }
  const ValueType to = type(operand);
  PW_ASSIGN_OR_RETURN(Dims dims, ScatterDims("scatter", type(updates), type(indices), axis, size));
  if (!to.dims.empty() && to.dims != dims) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scatter: operand %s is neither a scalar nor of the result's shape %s (updates %s, "
        "indices %s, axis %d)",
        to.ToString(), TypeToString(to.dtype, dims), type(updates).ToString(),
        type(indices).ToString(), axis));
  }
  if (to.dtype == DType::kBool && (combiner == Combiner::kAdd || combiner == Combiner::kMul)) {
    return UnsupportedTypeError(absl::StrFormat(
        "scatter: %s into a bool operand (%s) is not supported, as in JAX; max and min are "
        "logical or and and",
        CombinerName(combiner), to.ToString()));
  }
  // bfloat16 combines in float32 (the operand and updates widened, the
  // result rounded once), as every computing op on bfloat16.
  const bool bf16 = to.dtype == DType::kBF16;
  const DType computed = bf16 ? DType::kF32 : to.dtype;
  PW_ASSIGN_OR_RETURN(operand, Convert(operand, computed));
  PW_ASSIGN_OR_RETURN(updates, Convert(updates, to.dtype));  // cast to x's dtype, as JAX
  PW_ASSIGN_OR_RETURN(updates, Convert(updates, computed));
  Op op = MakeOp(OpKind::kScatter, {operand, indices, updates}, ValueType{computed, std::move(dims)});
  op.combiner = combiner;
  op.axis = axis;
  return bf16 ? RoundToBF16(Add(std::move(op))) : Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::ScatterAdd(int32_t updates, int32_t indices,
                                                    int64_t axis, int64_t size) {
  PW_RETURN_IF_ERROR(CheckValue(updates, "scatter_add"));
  PW_RETURN_IF_ERROR(CheckValue(indices, "scatter_add"));
  const ValueType tu = type(updates);
  if (tu.dtype == DType::kBool) {
    return UnsupportedTypeError(
        absl::StrFormat("scatter_add: updates must be numeric, got %s", tu.ToString()));
  }
  // Checked before the zero constant is added, so that an error adds nothing.
  PW_RETURN_IF_ERROR(ScatterDims("scatter_add", tu, type(indices), axis, size).status());
  const std::vector<uint8_t> zero(static_cast<size_t>(DTypeSize(tu.dtype)), 0);
  PW_ASSIGN_OR_RETURN(const int32_t zeros, Constant(tu.dtype, {}, zero));
  return Scatter(Combiner::kAdd, zeros, indices, updates, axis, size);
}

absl::StatusOr<int32_t> FunctionBuilder::TopK(int32_t x, int64_t k) {
  PW_RETURN_IF_ERROR(CheckValue(x, "top_k"));
  const ValueType tx = type(x);
  if (tx.dims.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "top_k: operand must have at least one dimension, got %s", tx.ToString()));
  }
  const int64_t n = tx.dims.back();
  if (k < 0 || k > n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "top_k: k must be in [0, %d] (the last dimension of %s), got %d", n, tx.ToString(), k));
  }
  if (n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "top_k: the last dimension of %s is beyond int32 positions", tx.ToString()));
  }
  Dims dims = tx.dims;
  dims.back() = k;
  // Widening is exact and keeps totalOrder (NaN payloads and signs, -0), so
  // the float32 kernel ranks bfloat16 values as they are.
  if (tx.dtype == DType::kBF16) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));
  }
  return AddOp(OpKind::kTopK, {x}, ValueType{DType::kI32, std::move(dims)});
}

absl::StatusOr<int32_t> FunctionBuilder::Sort(int32_t x, bool descending) {
  PW_RETURN_IF_ERROR(CheckValue(x, "sort"));
  const ValueType tx = type(x);
  if (tx.dims.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sort: operand must have at least one dimension, got %s", tx.ToString()));
  }
  if (tx.dims.back() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sort: the last dimension of %s is beyond int32 positions", tx.ToString()));
  }
  if (tx.dtype == DType::kBF16) {  // widening keeps the order: sort the float32 values
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));
  }
  Op op = MakeOp(OpKind::kSort, {x}, ValueType{DType::kI32, tx.dims});
  op.reverse = descending;
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Cumulative(Combiner combiner, int32_t x, int64_t axis,
                                                    bool reverse) {
  PW_RETURN_IF_ERROR(CheckValue(x, "cumulative"));
  if (combiner == Combiner::kSet || !IsCombiner(combiner)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cumulative: combiner must be add, mul, max or min, got %s", CombinerName(combiner)));
  }
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  if (rank == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cumulative: operand must have at least one dimension, got %s", tx.ToString()));
  }
  PW_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis("cumulative", axis, rank, tx));
  if (tx.dtype == DType::kBool && (combiner == Combiner::kAdd || combiner == Combiner::kMul)) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kI32));  // a count, as numpy's cumsum of bools
  }
  if (tx.dims[a] <= 1) return x;  // each element is its own running value
  // bfloat16 runs in float32, each running value rounded once.
  const bool bf16 = tx.dtype == DType::kBF16;
  if (bf16) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));
  }
  Op op = MakeOp(OpKind::kCumulative, {x}, type(x));
  op.combiner = combiner;
  op.axis = a;
  op.reverse = reverse;
  return bf16 ? RoundToBF16(Add(std::move(op))) : Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::Matmul(int32_t a, int32_t b) {
  PW_RETURN_IF_ERROR(CheckValue(a, "matmul"));
  PW_RETURN_IF_ERROR(CheckValue(b, "matmul"));
  const ValueType ta = type(a);
  const ValueType tb = type(b);
  const size_t ra = ta.dims.size();
  const size_t rb = tb.dims.size();
  if (ra < 2 || rb < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "matmul: operands need rank >= 2, got %s and %s", ta.ToString(), tb.ToString()));
  }
  Dims batch;
  if (ta.dims[ra - 1] != tb.dims[rb - 2] ||
      !BroadcastDims(absl::MakeConstSpan(ta.dims).subspan(0, ra - 2),
                     absl::MakeConstSpan(tb.dims).subspan(0, rb - 2), &batch)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "matmul: incompatible shapes %s and %s", ta.ToString(), tb.ToString()));
  }
  const DType dtype = PromoteTypes(ta.dtype, tb.dtype);
  PW_ASSIGN_OR_RETURN(a, Convert(a, dtype));
  PW_ASSIGN_OR_RETURN(b, Convert(b, dtype));
  batch.push_back(ta.dims[ra - 2]);
  batch.push_back(tb.dims[rb - 1]);
  if (dtype == DType::kBF16) {  // float32 products and sums (BLAS), rounded once
    PW_ASSIGN_OR_RETURN(a, Convert(a, DType::kF32));
    PW_ASSIGN_OR_RETURN(b, Convert(b, DType::kF32));
    return RoundToBF16(AddOp(OpKind::kMatmul, {a, b}, ValueType{DType::kF32, std::move(batch)}));
  }
  return AddOp(OpKind::kMatmul, {a, b}, ValueType{dtype, std::move(batch)});
}

absl::StatusOr<int32_t> FunctionBuilder::AllToAll(int32_t x, absl::string_view axis_name,
                                                  int64_t split_axis, int64_t concat_axis) {
  PW_RETURN_IF_ERROR(CheckValue(x, "all_to_all"));
  PW_RETURN_IF_ERROR(CheckAxisName("all_to_all", axis_name));
  const int64_t n = ir_->axis_size_;
  if (n < 1) {
    return absl::FailedPreconditionError(
        "all_to_all: the number of shards is unknown (FunctionBuilder::SetAxisSize)");
  }
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  PW_ASSIGN_OR_RETURN(const int64_t s, NormalizeAxis("all_to_all", split_axis, rank, tx));
  PW_ASSIGN_OR_RETURN(const int64_t c, NormalizeAxis("all_to_all", concat_axis, rank, tx));
  if (tx.dims[s] % n != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "all_to_all: split axis %d of %s does not divide into %d shards", s, tx.ToString(), n));
  }
  Dims dims = tx.dims;
  dims[s] /= n;
  dims[c] *= n;
  Op op = MakeOp(OpKind::kAllToAll, {x}, ValueType{tx.dtype, std::move(dims)});
  op.axis_name = std::string(axis_name);
  op.axis = s;
  op.concat_axis = c;
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::PsumScatter(int32_t x, absl::string_view axis_name,
                                                     int64_t axis) {
  PW_RETURN_IF_ERROR(CheckValue(x, "psum_scatter"));
  PW_RETURN_IF_ERROR(CheckAxisName("psum_scatter", axis_name));
  const int64_t n = ir_->axis_size_;
  if (n < 1) {
    return absl::FailedPreconditionError(
        "psum_scatter: the number of shards is unknown (FunctionBuilder::SetAxisSize)");
  }
  if (type(x).dtype == DType::kBool) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kI32));
  }
  const bool bf16 = type(x).dtype == DType::kBF16;
  if (bf16) {
    PW_ASSIGN_OR_RETURN(x, Convert(x, DType::kF32));
  }
  const ValueType tx = type(x);
  const int64_t rank = static_cast<int64_t>(tx.dims.size());
  PW_ASSIGN_OR_RETURN(const int64_t a, NormalizeAxis("psum_scatter", axis, rank, tx));
  if (tx.dims[a] != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "psum_scatter: dimension %d of %s must equal the number of shards, %d", a,
        tx.ToString(), n));
  }
  Dims dims = tx.dims;
  dims.erase(dims.begin() + a);
  Op op = MakeOp(OpKind::kPsumScatter, {x}, ValueType{tx.dtype, std::move(dims)});
  op.axis_name = std::string(axis_name);
  op.axis = a;
  return bf16 ? RoundToBF16(Add(std::move(op))) : Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::SimulatedCompute(int32_t x, int64_t duration_ns) {
  PW_RETURN_IF_ERROR(CheckValue(x, OpKindName(OpKind::kSimulatedCompute)));
  if (duration_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulated_compute: duration must be non-negative, got ", duration_ns, " ns"));
  }
  // Checked without forming the sum, which could overflow.
  if (duration_ns > kMaxSimulatedNs - ir_->simulated_ns_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulated_compute: a function's total simulated time must be at most ", kMaxSimulatedUs,
        " us (one hour); it has ", Micros(ir_->simulated_ns_), " us, plus ", Micros(duration_ns),
        " us"));
  }
  Op op = MakeOp(OpKind::kSimulatedCompute, {x}, type(x));
  op.duration_ns = duration_ns;
  ir_->simulated_ns_ += duration_ns;
  return Add(std::move(op));
}

absl::StatusOr<int32_t> FunctionBuilder::SimulatedComputeMicros(int32_t x, double microseconds) {
  // Written so that NaN fails too; then the conversion is defined.
  if (!(microseconds >= 0 && microseconds <= kMaxSimulatedUs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulated_compute: duration must be a finite number of microseconds from 0 to ", kMaxSimulatedUs,
        " (one hour), got ", Shortest(microseconds)));
  }
  return SimulatedCompute(x, std::llround(microseconds * 1000.0));
}

absl::Status FunctionBuilder::CheckNested(const std::string& label, absl::string_view role,
                                          const FunctionIr& f) const {
  if (f.nesting_depth() + 1 > kMaxNestingDepth) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: loops nest %d deep, more than the %d allowed", label, f.nesting_depth() + 1,
        kMaxNestingDepth));
  }
  if (f.has_collectives() && f.axis_name() != ir_->axis_name_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the %s has collectives over axis '%s', the function's axis is '%s'", label, role,
        f.axis_name(), ir_->axis_name_));
  }
  if (f.axis_size() != 0 && f.axis_size() != ir_->axis_size_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the %s was traced for %d shards, the function for %d", label, role, f.axis_size(),
        ir_->axis_size_));
  }
  return absl::OkStatus();
}

absl::Status FunctionBuilder::CheckNestedParams(
    const std::string& label, absl::string_view what, const FunctionIr& f,
    absl::Span<const ValueType> expected, absl::FunctionRef<std::string(int64_t)> role) const {
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!(f.param_type(static_cast<int>(i)) == expected[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s parameter %d is %s, but %s gives %s", label, what, i,
          f.param_type(static_cast<int>(i)).ToString(), role(static_cast<int64_t>(i)),
          expected[i].ToString()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> FunctionBuilder::Scan(std::shared_ptr<const FunctionIr> body,
                                              absl::Span<const int32_t> operands,
                                              int32_t num_carries, int32_t num_xs,
                                              int64_t length, bool reverse) {
  if (ir_ == nullptr) return absl::FailedPreconditionError("scan: builder already built");
  if (body == nullptr) return absl::InvalidArgumentError("scan: no body function");
  for (int32_t v : operands) PW_RETURN_IF_ERROR(CheckValue(v, "scan"));
  const int64_t n = static_cast<int64_t>(operands.size());
  if (num_carries < 0 || num_xs < 0 || int64_t{num_carries} + num_xs > n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scan: %d carries and %d xs do not fit in %d operands", num_carries, num_xs, n));
  }
  if (length < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("scan: negative length %d", length));
  }
  const FunctionIr& f = *body;
  const std::string label = absl::StrCat("scan of @", f.name());
  if (f.nesting_depth() + 1 > kMaxNestingDepth) return CheckNested(label, "body", f);
  if (f.num_params() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the body takes %d parameters, the scan has %d operands (%d carries, %d xs, %d "
        "consts)",
        label, f.num_params(), n, num_carries, num_xs, n - num_carries - num_xs));
  }
  auto role = [&](int64_t i) -> std::string {
    if (i < num_carries) return absl::StrCat("carry ", i);
    if (i < int64_t{num_carries} + num_xs) return absl::StrCat("xs ", i - num_carries);
    return absl::StrCat("const ", i - num_carries - num_xs);
  };
  std::vector<ValueType> expected;
  for (int64_t i = 0; i < n; ++i) {
    const ValueType& t = type(operands[i]);
    expected.push_back(t);
    if (i >= num_carries && i < int64_t{num_carries} + num_xs) {
      if (t.dims.empty() || t.dims[0] != length) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: %s is %s, which needs a leading dimension of the length, %d", label, role(i),
            t.ToString(), length));
      }
      expected.back().dims.erase(expected.back().dims.begin());
    }
  }
  PW_RETURN_IF_ERROR(CheckNestedParams(label, "body", f, expected, role));
  if (f.num_outputs() < num_carries) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the body returns %d values, fewer than its %d carries", label, f.num_outputs(),
        num_carries));
  }
  ValueType result;
  for (int i = 0; i < f.num_outputs(); ++i) {
    ValueType t = f.output_type(i);
    if (i < num_carries) {
      if (!(t == type(operands[i]))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: the body returns %s for carry %d, which is %s; a carry keeps its type", label,
            t.ToString(), i, type(operands[i]).ToString()));
      }
    } else {
      t.dims.insert(t.dims.begin(), length);
    }
    result.elements.push_back(std::move(t));
  }
  PW_RETURN_IF_ERROR(CheckNested(label, "body", f));
  // Checked without forming the product, which could overflow.
  const int64_t body_ns = f.simulated_ns();
  if (body_ns > 0 && length > (kMaxSimulatedNs - ir_->simulated_ns_) / body_ns) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": ", length, " iterations of ", Micros(body_ns),
        " us of simulated compute take the function beyond its most simulated time, ",
        kMaxSimulatedUs, " us (one hour)"));
  }
  Op op = MakeOp(OpKind::kScan, absl::InlinedVector<int32_t, 2>(operands.begin(), operands.end()),
                 std::move(result));
  op.body = std::move(body);
  op.length = length;
  op.num_carries = num_carries;
  op.num_xs = num_xs;
  op.reverse = reverse;
  const int depth = op.body->nesting_depth() + 1;
  PW_ASSIGN_OR_RETURN(const int32_t v, Add(std::move(op)));
  ir_->simulated_ns_ += length * body_ns;
  ir_->nesting_depth_ = std::max(ir_->nesting_depth_, depth);
  return v;
}

absl::StatusOr<int32_t> FunctionBuilder::While(std::shared_ptr<const FunctionIr> cond,
                                               std::shared_ptr<const FunctionIr> body,
                                               absl::Span<const int32_t> operands,
                                               int32_t num_carries) {
  if (ir_ == nullptr) return absl::FailedPreconditionError("while: builder already built");
  if (cond == nullptr) return absl::InvalidArgumentError("while: no cond function");
  if (body == nullptr) return absl::InvalidArgumentError("while: no body function");
  for (int32_t v : operands) PW_RETURN_IF_ERROR(CheckValue(v, "while"));
  const int64_t n = static_cast<int64_t>(operands.size());
  if (num_carries < 1 || num_carries > n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "while: %d carries do not fit in %d operands (a while carries at least one value)",
        num_carries, n));
  }
  const std::string label =
      absl::StrCat("while of @", cond->name(), " and @", body->name());
  auto role = [&](int64_t i) -> std::string {
    return i < num_carries ? absl::StrCat("carry ", i)
                           : absl::StrCat("const ", i - num_carries);
  };
  std::vector<ValueType> expected;
  for (int32_t v : operands) expected.push_back(type(v));
  for (const auto& [what, f] : {std::pair<const char*, const FunctionIr*>{"cond", cond.get()},
                                {"body", body.get()}}) {
    PW_RETURN_IF_ERROR(CheckNested(label, what, *f));
    if (f->num_params() != n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the %s takes %d parameters, the loop has %d operands (%d carries, %d consts)",
          label, what, f->num_params(), n, num_carries, n - num_carries));
    }
    PW_RETURN_IF_ERROR(CheckNestedParams(label, what, *f, expected, role));
    if (f->simulated_ns() > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the %s has simulated compute, which a loop whose trip count is known only on "
          "the device cannot count (a scan's body may have it)",
          label, what));
    }
  }
  const ValueType bool_scalar(DType::kBool, {});
  if (cond->num_outputs() != 1 || !(cond->output_type(0) == bool_scalar)) {
    std::string outputs;
    for (int i = 0; i < cond->num_outputs(); ++i) {
      absl::StrAppend(&outputs, i > 0 ? ", " : "", cond->output_type(i).ToString());
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the cond must return one bool scalar (pred[]), it returns (%s)", label, outputs));
  }
  if (body->num_outputs() != num_carries) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the body returns %d values for %d carries", label, body->num_outputs(),
        num_carries));
  }
  ValueType result;
  for (int i = 0; i < num_carries; ++i) {
    const ValueType& t = body->output_type(i);
    if (!(t == type(operands[i]))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the body returns %s for carry %d, which is %s; a carry keeps its type", label,
          t.ToString(), i, type(operands[i]).ToString()));
    }
    result.elements.push_back(t);
  }
  Op op = MakeOp(OpKind::kWhile, absl::InlinedVector<int32_t, 2>(operands.begin(), operands.end()),
                 std::move(result));
  const int depth = std::max(cond->nesting_depth(), body->nesting_depth()) + 1;
  op.cond = std::move(cond);
  op.body = std::move(body);
  op.num_carries = num_carries;
  PW_ASSIGN_OR_RETURN(const int32_t v, Add(std::move(op)));
  ir_->nesting_depth_ = std::max(ir_->nesting_depth_, depth);
  return v;
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::WhileResults(
    std::shared_ptr<const FunctionIr> cond, std::shared_ptr<const FunctionIr> body,
    absl::Span<const int32_t> operands, int32_t num_carries) {
  PW_ASSIGN_OR_RETURN(const int32_t tuple,
                      While(std::move(cond), std::move(body), operands, num_carries));
  return Elements(tuple);
}

absl::StatusOr<int32_t> FunctionBuilder::GetElement(int32_t tuple, int64_t index) {
  PW_RETURN_IF_ERROR(CheckValue(tuple, "get_element", /*tuple_ok=*/true));
  const ValueType& t = type(tuple);
  if (!t.is_tuple()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "get_element: operand %%%d is %s, not a tuple (as scan, while, svd, lu and eigh give)", tuple, t.ToString()));
  }
  if (index < 0 || index >= static_cast<int64_t>(t.elements.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "get_element: index %d is out of range for %s", index, t.ToString()));
  }
  ValueType element = t.elements[static_cast<size_t>(index)];
  Op op = MakeOp(OpKind::kGetElement, {tuple}, std::move(element));
  op.index = static_cast<int32_t>(index);
  return Add(std::move(op));
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::ScanResults(
    std::shared_ptr<const FunctionIr> body, absl::Span<const int32_t> operands,
    int32_t num_carries, int32_t num_xs, int64_t length, bool reverse) {
  PW_ASSIGN_OR_RETURN(const int32_t tuple,
                      Scan(std::move(body), operands, num_carries, num_xs, length, reverse));
  return Elements(tuple);
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::Elements(int32_t tuple) {
  std::vector<int32_t> results;
  const size_t n = type(tuple).elements.size();
  for (size_t i = 0; i < n; ++i) {
    PW_ASSIGN_OR_RETURN(const int32_t v, GetElement(tuple, static_cast<int64_t>(i)));
    results.push_back(v);
  }
  return results;
}

namespace {

// OK if `t`, the operand of linear algebra op `op`, is float32 or float64
// matrices (square ones if `square`) of dimensions LAPACK's int32 can index.
absl::Status CheckLapackMatrices(absl::string_view op, const ValueType& t, bool square) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: operand must be float32 or float64, got %s", op, t.ToString()));
  }
  const size_t rank = t.dims.size();
  if (square && (rank < 2 || t.dims[rank - 2] != t.dims[rank - 1])) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: operand must be square matrices [..., n, n], got %s", op, t.ToString()));
  }
  if (rank < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: operand must have at least two dimensions (a matrix), got %s", op, t.ToString()));
  }
  if (t.dims[rank - 2] > std::numeric_limits<int32_t>::max() ||
      t.dims[rank - 1] > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the matrices of %s are beyond int32 dimensions", op, t.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int32_t> FunctionBuilder::Svd(int32_t x, bool full_matrices) {
  PW_RETURN_IF_ERROR(CheckValue(x, "svd"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckLapackMatrices("svd", tx, /*square=*/false));
  const size_t rank = tx.dims.size();
  const int64_t m = tx.dims[rank - 2];
  const int64_t n = tx.dims[rank - 1];
  const int64_t k = std::min(m, n);
  // LAPACK's work array (3k^2 + max(max(m, n), 4k^2 + 4k) elements) is
  // indexed by int32.
  if (3 * k * k + std::max(std::max(m, n), 4 * k * k + 4 * k) >
      std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "svd: the matrices of %s are too large for LAPACK's workspace (min(m, n) beyond "
        "about 17500)", tx.ToString()));
  }
  Dims batch(tx.dims.begin(), tx.dims.end() - 2);
  auto with = [&](int64_t a, int64_t b) {
    Dims d = batch;
    d.push_back(a);
    if (b >= 0) d.push_back(b);
    return ValueType{tx.dtype, std::move(d)};
  };
  ValueType result;
  result.elements.push_back(with(m, full_matrices ? m : k));
  result.elements.push_back(with(k, -1));
  result.elements.push_back(with(full_matrices ? n : k, n));
  Op op = MakeOp(OpKind::kSvd, {x}, std::move(result));
  op.full_matrices = full_matrices;
  return Add(std::move(op));
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::SvdResults(int32_t x, bool full_matrices) {
  PW_ASSIGN_OR_RETURN(const int32_t tuple, Svd(x, full_matrices));
  return Elements(tuple);
}

absl::StatusOr<int32_t> FunctionBuilder::Lu(int32_t x) {
  PW_RETURN_IF_ERROR(CheckValue(x, "lu"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckLapackMatrices("lu", tx, /*square=*/true));
  Dims rows(tx.dims.begin(), tx.dims.end() - 1);
  ValueType result;
  result.elements.push_back(tx);
  result.elements.push_back(ValueType{DType::kI32, rows});
  result.elements.push_back(ValueType{DType::kI32, rows});
  return AddOp(OpKind::kLu, {x}, std::move(result));
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::LuResults(int32_t x) {
  PW_ASSIGN_OR_RETURN(const int32_t tuple, Lu(x));
  return Elements(tuple);
}

absl::StatusOr<int32_t> FunctionBuilder::Eigh(int32_t x) {
  PW_RETURN_IF_ERROR(CheckValue(x, "eigh"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckLapackMatrices("eigh", tx, /*square=*/true));
  ValueType result;
  result.elements.push_back(ValueType{tx.dtype, Dims(tx.dims.begin(), tx.dims.end() - 1)});
  result.elements.push_back(tx);
  return AddOp(OpKind::kEigh, {x}, std::move(result));
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::EighResults(int32_t x) {
  PW_ASSIGN_OR_RETURN(const int32_t tuple, Eigh(x));
  return Elements(tuple);
}

absl::StatusOr<int32_t> FunctionBuilder::Cholesky(int32_t x) {
  PW_RETURN_IF_ERROR(CheckValue(x, "cholesky"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckLapackMatrices("cholesky", tx, /*square=*/true));
  return AddOp(OpKind::kCholesky, {x}, tx);
}

absl::StatusOr<int32_t> FunctionBuilder::Qr(int32_t x, bool full_matrices) {
  PW_RETURN_IF_ERROR(CheckValue(x, "qr"));
  const ValueType tx = type(x);
  PW_RETURN_IF_ERROR(CheckLapackMatrices("qr", tx, /*square=*/false));
  const size_t rank = tx.dims.size();
  const int64_t m = tx.dims[rank - 2];
  const int64_t n = tx.dims[rank - 1];
  const int64_t cols = full_matrices ? m : std::min(m, n);  // q's
  Dims q(tx.dims.begin(), tx.dims.end() - 1);
  q.push_back(cols);
  Dims r(tx.dims.begin(), tx.dims.end() - 2);
  r.push_back(cols);
  r.push_back(n);
  ValueType result;
  result.elements.push_back(ValueType{tx.dtype, std::move(q)});
  result.elements.push_back(ValueType{tx.dtype, std::move(r)});
  Op op = MakeOp(OpKind::kQr, {x}, std::move(result));
  op.full_matrices = full_matrices;
  return Add(std::move(op));
}

absl::StatusOr<std::vector<int32_t>> FunctionBuilder::QrResults(int32_t x, bool full_matrices) {
  PW_ASSIGN_OR_RETURN(const int32_t tuple, Qr(x, full_matrices));
  return Elements(tuple);
}

absl::StatusOr<int32_t> FunctionBuilder::TriangularSolve(int32_t a, int32_t b, bool lower,
                                                         bool unit_diagonal, bool transpose_a) {
  PW_RETURN_IF_ERROR(CheckValue(a, "triangular_solve"));
  PW_RETURN_IF_ERROR(CheckValue(b, "triangular_solve"));
  const ValueType ta = type(a);
  const ValueType tb = type(b);
  if ((ta.dtype != DType::kF32 && ta.dtype != DType::kF64) || tb.dtype != ta.dtype) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "triangular_solve: a and b must both be float32 or both float64, got %s and %s",
        ta.ToString(), tb.ToString()));
  }
  const size_t rank = ta.dims.size();
  if (rank < 2 || ta.dims[rank - 2] != ta.dims[rank - 1] || tb.dims.size() != rank ||
      !std::equal(ta.dims.begin(), ta.dims.end() - 1, tb.dims.begin())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "triangular_solve: a must be square matrices [..., n, n] and b [..., n, k] with the "
        "same batch dims, got %s and %s", ta.ToString(), tb.ToString()));
  }
  if (ta.dims[rank - 1] > std::numeric_limits<int32_t>::max() ||
      tb.dims[rank - 1] > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "triangular_solve: the matrices of %s and %s are beyond int32 dimensions", ta.ToString(),
        tb.ToString()));
  }
  Op op = MakeOp(OpKind::kTriangularSolve, {a, b}, tb);
  op.lower = lower;
  op.unit_diagonal = unit_diagonal;
  op.transpose_a = transpose_a;
  return Add(std::move(op));
}

absl::StatusOr<std::shared_ptr<const FunctionIr>> FunctionBuilder::Build(
    absl::Span<const int32_t> outputs) {
  if (ir_ == nullptr) return absl::FailedPreconditionError("build: builder already built");
  if (outputs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("build: function @", ir_->name_, " needs at least one output"));
  }
  for (int32_t v : outputs) PW_RETURN_IF_ERROR(CheckValue(v, "return"));
  ir_->outputs_.assign(outputs.begin(), outputs.end());
  return std::shared_ptr<const FunctionIr>(std::move(ir_));
}

}  // namespace pw
