#include "csrc/function_ir/function_ir_wire.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "csrc/base/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace pw {
namespace {

// Constant literals are sent as the host's bytes, which every host we build
// for lays out little-endian (the order function_ir.proto promises).
static_assert(std::endian::native == std::endian::little,
              "function_ir.proto literals are little-endian");

// Each enum with its wire numbers: one list per enum, from which both
// directions of the mapping are made.
// The op kinds' pairs come from the op registry (op_registry.h): V is one
// of the two case makers below, and PW_OPS's rows are passed to it.
#define PW_WIRE_OP_KINDS(V) PW_OPS(V##_OP)
#define PW_WIRE_TO_CASE_OP(e, name, w, arity, cls, rule) PW_WIRE_TO_CASE(OpKind::e, wire::OP_##w)
#define PW_WIRE_FROM_CASE_OP(e, name, w, arity, cls, rule) PW_WIRE_FROM_CASE(OpKind::e, wire::OP_##w)

#define PW_WIRE_DTYPES(V)                                               \
  V(DType::kF32, wire::DTYPE_F32) V(DType::kF64, wire::DTYPE_F64)       \
  V(DType::kI32, wire::DTYPE_I32) V(DType::kBool, wire::DTYPE_BOOL)   \
  V(DType::kU32, wire::DTYPE_U32) V(DType::kBF16, wire::DTYPE_BF16)

#define PW_WIRE_REDUCE_KINDS(V)                                                           \
  V(ReduceKind::kSum, wire::REDUCE_SUM) V(ReduceKind::kMean, wire::REDUCE_MEAN)           \
  V(ReduceKind::kMax, wire::REDUCE_MAX) V(ReduceKind::kMin, wire::REDUCE_MIN)             \
  V(ReduceKind::kArgmax, wire::REDUCE_ARGMAX)

#define PW_WIRE_COMBINERS(V)                                                          \
  V(Combiner::kAdd, wire::COMBINER_ADD) V(Combiner::kMul, wire::COMBINER_MUL)         \
  V(Combiner::kMax, wire::COMBINER_MAX) V(Combiner::kMin, wire::COMBINER_MIN)         \
  V(Combiner::kSet, wire::COMBINER_SET)

// ToWire(Cpp) and FromWire(Wire) for the pairs LIST(V) gives. ToWire's
// switch names every C++ enumerator (-Wswitch warns of a missing one);
// FromWire has a default, since a proto3 enum field may hold any int32.
#define PW_WIRE_TO_CASE(cpp, w) \
  case cpp:                     \
    return w;
#define PW_WIRE_FROM_CASE(cpp, w) \
  case w:                         \
    return cpp;
#define PW_WIRE_ENUM_MAPPING(Cpp, Wire, LIST)       \
  Wire ToWire(Cpp value) {                          \
    switch (value) { LIST(PW_WIRE_TO_CASE) }        \
    return Wire{};                                  \
  }                                                 \
  std::optional<Cpp> FromWire(Wire value) {         \
    switch (value) {                                \
      LIST(PW_WIRE_FROM_CASE)                       \
      default:                                      \
        break;                                      \
    }                                               \
    return std::nullopt;                            \
  }

PW_WIRE_ENUM_MAPPING(OpKind, wire::OpKind, PW_WIRE_OP_KINDS)
PW_WIRE_ENUM_MAPPING(DType, wire::DType, PW_WIRE_DTYPES)
PW_WIRE_ENUM_MAPPING(ReduceKind, wire::ReduceKind, PW_WIRE_REDUCE_KINDS)
PW_WIRE_ENUM_MAPPING(Combiner, wire::Combiner, PW_WIRE_COMBINERS)

template <typename Container>
void Append(const Container& values, google::protobuf::RepeatedField<int64_t>* out) {
  out->Reserve(static_cast<int>(values.size()));
  for (int64_t v : values) out->Add(v);
}

std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

void EncodeFunction(const FunctionIr& ir, wire::FunctionIr* out);

// Writes the arguments of the builder call that makes `op` (see
// function_ir.proto). The literal and a loop's nested functions only
// `with_literal`: decoding compares a rebuilt op with the one received, and
// the literal went to the builder verbatim, the functions through decodings
// of their own (a copy of either would only cost memory and time).
void EncodeOp(const Op& op, bool with_literal, wire::Op* out) {
  out->set_kind(ToWire(op.kind));
  out->mutable_operands()->Reserve(static_cast<int>(op.operands.size()));
  for (int32_t v : op.operands) out->add_operands(v);
  switch (op.kind) {
    case OpKind::kConstant:
      if (with_literal) out->set_literal(op.literal.data(), op.literal.size());
      [[fallthrough]];
    case OpKind::kParameter:
      out->set_dtype(ToWire(op.type.dtype));
      [[fallthrough]];
    case OpKind::kReshape:
    case OpKind::kBroadcastTo:
      Append(op.type.dims, out->mutable_dims());
      break;
    case OpKind::kConvert:
    case OpKind::kBitcastConvert:
      out->set_dtype(ToWire(op.type.dtype));
      break;
    case OpKind::kPsum:
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
    case OpKind::kAxisIndex:
      out->set_axis_name(op.axis_name);
      break;
    case OpKind::kSimulatedCompute:
      out->set_duration_ns(op.duration_ns);
      break;
    case OpKind::kReduce:
      out->set_reduce_kind(ToWire(op.reduce_kind));
      Append(op.axes, out->mutable_axes());
      out->set_keepdims(op.keepdims);
      break;
    case OpKind::kAllGather:
    case OpKind::kPsumScatter:
      out->set_axis_name(op.axis_name);
      out->set_axis(op.axis);
      break;
    case OpKind::kPpermute:
      out->set_axis_name(op.axis_name);
      for (int64_t s : op.perm_source) out->add_perm_source(s);
      break;
    case OpKind::kTranspose:
    case OpKind::kRev:
      Append(op.axes, out->mutable_axes());
      break;
    case OpKind::kSlice:
      Append(op.slice_start, out->mutable_slice_start());
      Append(op.slice_limit, out->mutable_slice_limit());
      for (size_t d = 0; d < op.slice_step.size(); ++d) {
        // The IR stores step 1 where at most one element is taken; sent as
        // is, the builder would take limit - start elements there.
        out->add_slice_step(op.type.dims[d] <= 1
                                ? std::max<int64_t>(1, op.slice_limit[d] - op.slice_start[d])
                                : op.slice_step[d]);
      }
      break;
    case OpKind::kPad:
      Append(op.pad_lo, out->mutable_pad_lo());
      Append(op.pad_hi, out->mutable_pad_hi());
      Append(op.pad_interior, out->mutable_pad_interior());
      break;
    case OpKind::kConcatenate:
    case OpKind::kTake:
      out->set_axis(op.axis);
      break;
    case OpKind::kScatter:
      out->set_combiner(ToWire(op.combiner));
      out->set_axis(op.axis);
      out->set_size(op.type.dims[op.axis]);
      break;
    case OpKind::kCumulative:
      out->set_combiner(ToWire(op.combiner));
      out->set_axis(op.axis);
      out->set_reverse(op.reverse);
      break;
    case OpKind::kTopK:
      out->set_size(op.type.dims.back());
      break;
    case OpKind::kSort:
      out->set_reverse(op.reverse);
      break;
    case OpKind::kAllToAll:
      out->set_axis_name(op.axis_name);
      out->set_axis(op.axis);
      out->set_concat_axis(op.concat_axis);
      break;
    case OpKind::kScan:
      if (with_literal) EncodeFunction(*op.body, out->mutable_body());
      out->set_length(op.length);
      out->set_num_carries(op.num_carries);
      out->set_num_xs(op.num_xs);
      out->set_reverse(op.reverse);
      break;
    case OpKind::kWhile:
      if (with_literal) {
        EncodeFunction(*op.cond, out->mutable_cond());
        EncodeFunction(*op.body, out->mutable_body());
      }
      out->set_num_carries(op.num_carries);
      break;
    case OpKind::kGetElement:
      out->set_index(op.index);
      break;
    case OpKind::kSvd:
    case OpKind::kQr:
      out->set_full_matrices(op.full_matrices);
      break;
    case OpKind::kTriangularSolve:
      out->set_lower(op.lower);
      out->set_unit_diagonal(op.unit_diagonal);
      out->set_transpose_a(op.transpose_a);
      break;
    default:
      break;  // operands only: the elementwise ops, copy, matmul
  }
}

absl::Status WireError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("function wire: ", message));
}

// "op 3 (add)".
std::string OpLabel(int index, OpKind kind) {
  return absl::StrFormat("op %d (%s)", index, OpKindName(kind));
}

// A builder error for op `index`, as InvalidArgument whatever its code (an
// all_gather without an axis size is FailedPrecondition to a tracer, but
// from the network it is a malformed message).
absl::Status BuilderError(int index, const absl::Status& status) {
  return WireError(absl::StrFormat("op %d: %s", index, status.message()));
}

// How many operands `kind` takes; -2 for "two or more" (concatenate of one
// value is that value, not an op).
int OperandCount(OpKind kind) {
  const int arity = GetOpInfo(kind).arity;
  return arity < 0 ? -2 : arity;
}

// Checks what the builder cannot be trusted with or does not check itself,
// before it is called: the operand count (the replay reads operands by
// position), that operands are earlier ops, ranks (kMaxWireRank), enum
// values and literals. Everything else is the builder's to check, or
// CheckSameOp's.
absl::Status CheckOpShape(int index, OpKind kind, const wire::Op& w) {
  const int n = w.operands_size();
  const int expected = OperandCount(kind);
  if (!IsLoopOp(kind) && (expected >= 0 ? n != expected : n < -expected)) {
    return WireError(absl::StrFormat("%s has %d operands, takes %s%d", OpLabel(index, kind), n,
                                     expected >= 0 ? "" : "at least ", std::abs(expected)));
  }
  for (int32_t v : w.operands()) {
    if (v < 0 || v >= index) {
      return WireError(absl::StrFormat("%s: operand %d is not an earlier op",
                                       OpLabel(index, kind), v));
    }
  }
  // The comparison with the rebuilt op leaves literals and bodies out
  // (CheckSameOp).
  if (kind != OpKind::kConstant && !w.literal().empty()) {
    return WireError(absl::StrFormat("%s has a literal; only constants take one",
                                     OpLabel(index, kind)));
  }
  if (IsLoopOp(kind) && !w.has_body()) {
    return WireError(absl::StrFormat("%s has no body", OpLabel(index, kind)));
  }
  if (!IsLoopOp(kind) && w.has_body()) {
    return WireError(
        absl::StrFormat("%s has a body; only loops take one", OpLabel(index, kind)));
  }
  if (kind == OpKind::kWhile && !w.has_cond()) {
    return WireError(absl::StrFormat("%s has no cond", OpLabel(index, kind)));
  }
  if (kind != OpKind::kWhile && w.has_cond()) {
    return WireError(
        absl::StrFormat("%s has a cond; only while loops take one", OpLabel(index, kind)));
  }
  if (w.dims_size() > kMaxWireRank) {
    return WireError(absl::StrFormat("%s: %d dims, more than the %d a value may have",
                                     OpLabel(index, kind), w.dims_size(), kMaxWireRank));
  }
  if ((kind == OpKind::kParameter || kind == OpKind::kConstant || kind == OpKind::kConvert ||
       kind == OpKind::kBitcastConvert) &&
      !FromWire(w.dtype()).has_value()) {
    return WireError(
        absl::StrFormat("%s: unknown dtype %d", OpLabel(index, kind), static_cast<int>(w.dtype())));
  }
  if (kind == OpKind::kReduce && !FromWire(w.reduce_kind()).has_value()) {
    return WireError(absl::StrFormat("%s: unknown reduce kind %d", OpLabel(index, kind),
                                     static_cast<int>(w.reduce_kind())));
  }
  if ((kind == OpKind::kScatter || kind == OpKind::kCumulative) &&
      !FromWire(w.combiner()).has_value()) {
    return WireError(absl::StrFormat("%s: unknown combiner %d", OpLabel(index, kind),
                                     static_cast<int>(w.combiner())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const FunctionIr>> Decode(const wire::FunctionIr& proto,
                                                          int depth);

// Nested function `role` ("body", "cond") of loop op `index`, decoded at
// `depth`; its errors name the op and the role.
absl::StatusOr<std::shared_ptr<const FunctionIr>> DecodeNested(const wire::FunctionIr& proto,
                                                                int depth, int index,
                                                                OpKind kind,
                                                                absl::string_view role) {
  absl::StatusOr<std::shared_ptr<const FunctionIr>> f = Decode(proto, depth);
  if (!f.ok()) {
    return WireError(absl::StrFormat("%s %s: %s", OpLabel(index, kind), role,
                                     absl::StripPrefix(f.status().message(), "function wire: ")));
  }
  return f;
}

// The builder call that makes op `index` from `w` (already checked by
// CheckOpShape); the builder's own checks apply to every argument. `depth`
// is the nesting depth of the function being decoded (0: the outermost).
absl::StatusOr<int32_t> Replay(FunctionBuilder& b, int index, OpKind kind, const wire::Op& w,
                               int depth) {
  auto operand = [&](int i) { return w.operands(i); };
  const absl::string_view axis_name = w.axis_name();
  if (IsBinaryOp(kind)) return b.Binary(kind, operand(0), operand(1));
  if (IsUnaryOp(kind)) return b.Unary(kind, operand(0));
  switch (kind) {
    case OpKind::kParameter: {
      const DType dtype = *FromWire(w.dtype());
      const Dims dims(w.dims().begin(), w.dims().end());
      // Parameter() trusts its caller with the type (a tracer passes a
      // numpy array's); from the network it is checked here.
      PW_RETURN_IF_ERROR(CheckedNumBytes("parameter", dtype, dims).status());
      return b.Parameter(dtype, dims);
    }
    case OpKind::kConstant: {
      const std::string& literal = w.literal();
      return b.Constant(*FromWire(w.dtype()), Dims(w.dims().begin(), w.dims().end()),
                        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(literal.data()),
                                            literal.size()));
    }
    case OpKind::kConvert:
      return b.Convert(operand(0), *FromWire(w.dtype()));
    case OpKind::kBitcastConvert:
      return b.BitcastConvert(operand(0), *FromWire(w.dtype()));
    case OpKind::kSelect:
      return b.Select(operand(0), operand(1), operand(2));
    case OpKind::kPsum:
      return b.Psum(operand(0), axis_name);
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
      return b.Pcollective(kind, operand(0), axis_name);
    case OpKind::kAxisIndex:
      return b.AxisIndex(axis_name);
    case OpKind::kSimulatedCompute:
      return b.SimulatedCompute(operand(0), w.duration_ns());
    case OpKind::kReduce: {
      // The IR keeps the reduced axes, sorted; all of them is how a
      // reduction over every axis (the only kind argmax of rank > 1 takes)
      // reads, so that is replayed as "all axes".
      const std::vector<int64_t> axes = ToVector(w.axes());
      const bool all = axes.size() == b.type(operand(0)).dims.size();
      return b.Reduce(*FromWire(w.reduce_kind()), operand(0), all ? nullptr : &axes,
                      w.keepdims());
    }
    case OpKind::kAllGather:
      return b.AllGather(operand(0), axis_name, w.axis());
    case OpKind::kPpermute: {
      std::vector<std::pair<int64_t, int64_t>> perm;
      for (int d = 0; d < w.perm_source_size(); ++d) {
        if (w.perm_source(d) != -1) perm.emplace_back(w.perm_source(d), d);
      }
      return b.Ppermute(operand(0), axis_name, perm);
    }
    case OpKind::kCopy:
      return b.Copy(operand(0));
    case OpKind::kReshape:
      return b.Reshape(operand(0), Dims(w.dims().begin(), w.dims().end()));
    case OpKind::kBroadcastTo:
      return b.BroadcastTo(operand(0), Dims(w.dims().begin(), w.dims().end()));
    case OpKind::kTranspose:
      return b.Transpose(operand(0), ToVector(w.axes()));
    case OpKind::kSlice:
      return b.Slice(operand(0), ToVector(w.slice_start()), ToVector(w.slice_limit()),
                     ToVector(w.slice_step()));
    case OpKind::kRev:
      return b.Rev(operand(0), ToVector(w.axes()));
    case OpKind::kPad:
      return b.Pad(operand(0), ToVector(w.pad_lo()), ToVector(w.pad_hi()),
                   ToVector(w.pad_interior()));
    case OpKind::kConcatenate:
      return b.Concatenate(w.operands(), w.axis());
    case OpKind::kTake:
      return b.Take(operand(0), operand(1), w.axis());
    case OpKind::kScatter:
      return b.Scatter(*FromWire(w.combiner()), operand(0), operand(1), operand(2), w.axis(),
                       w.size());
    case OpKind::kCumulative:
      return b.Cumulative(*FromWire(w.combiner()), operand(0), w.axis(), w.reverse());
    case OpKind::kTopK:
      return b.TopK(operand(0), w.size());
    case OpKind::kSort:
      return b.Sort(operand(0), w.reverse());
    case OpKind::kMatmul:
      return b.Matmul(operand(0), operand(1));
    case OpKind::kAllToAll:
      return b.AllToAll(operand(0), axis_name, w.axis(), w.concat_axis());
    case OpKind::kPsumScatter:
      return b.PsumScatter(operand(0), axis_name, w.axis());
    case OpKind::kScan: {
      PW_ASSIGN_OR_RETURN(std::shared_ptr<const FunctionIr> body,
                          DecodeNested(w.body(), depth + 1, index, kind, "body"));
      return b.Scan(std::move(body), w.operands(), w.num_carries(), w.num_xs(), w.length(),
                    w.reverse());
    }
    case OpKind::kWhile: {
      PW_ASSIGN_OR_RETURN(std::shared_ptr<const FunctionIr> cond,
                          DecodeNested(w.cond(), depth + 1, index, kind, "cond"));
      PW_ASSIGN_OR_RETURN(std::shared_ptr<const FunctionIr> body,
                          DecodeNested(w.body(), depth + 1, index, kind, "body"));
      return b.While(std::move(cond), std::move(body), w.operands(), w.num_carries());
    }
    case OpKind::kGetElement:
      return b.GetElement(operand(0), w.index());
    case OpKind::kSvd:
      return b.Svd(operand(0), w.full_matrices());
    case OpKind::kLu:
      return b.Lu(operand(0));
    case OpKind::kEigh:
      return b.Eigh(operand(0));
    case OpKind::kCholesky:
      return b.Cholesky(operand(0));
    case OpKind::kQr:
      return b.Qr(operand(0), w.full_matrices());
    case OpKind::kTriangularSolve:
      return b.TriangularSolve(operand(0), operand(1), w.lower(), w.unit_diagonal(),
                               w.transpose_a());
    default:
      break;  // binary and unary, above
  }
  return WireError(absl::StrCat("op ", index, ": unknown kind"));  // not reached
}

// Fields a decoder does not know: a newer peer's attribute, or corruption.
absl::Status CheckNoUnknownFields(const google::protobuf::Message& message,
                                  absl::string_view what) {
  const google::protobuf::UnknownFieldSet& unknown =
      message.GetReflection()->GetUnknownFields(message);
  if (!unknown.empty()) {
    return WireError(absl::StrFormat("%s has a field this build does not know (number %d)", what,
                                     unknown.field(0).number()));
  }
  return absl::OkStatus();
}

// OK if `rebuilt` (the builder's op, re-encoded) is what `w` says, literal
// aside; otherwise names the fields that differ.
absl::Status CheckSameOp(int index, OpKind kind, const wire::Op& w, const wire::Op& rebuilt) {
  google::protobuf::util::MessageDifferencer differencer;
  differencer.IgnoreField(wire::Op::descriptor()->FindFieldByName("literal"));
  differencer.IgnoreField(wire::Op::descriptor()->FindFieldByName("body"));
  differencer.IgnoreField(wire::Op::descriptor()->FindFieldByName("cond"));
  std::string report;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(w, rebuilt)) return absl::OkStatus();
  report = absl::StrReplaceAll(absl::StripSuffix(report, "\n"), {{"\n", "; "}});
  return WireError(absl::StrFormat(
      "%s is not in the form FunctionBuilder makes it (received -> rebuilt: %s)",
      OpLabel(index, kind), report));
}

void EncodeFunction(const FunctionIr& ir, wire::FunctionIr* out) {
  out->set_name(ir.name());
  out->set_axis_name(ir.axis_name());
  out->set_axis_size(ir.axis_size());
  out->mutable_ops()->Reserve(static_cast<int>(ir.ops().size()));
  for (const Op& op : ir.ops()) EncodeOp(op, /*with_literal=*/true, out->add_ops());
  for (int32_t p : ir.params()) out->add_params(p);
  for (int32_t o : ir.outputs()) out->add_outputs(o);
}

}  // namespace

void ToProto(const FunctionIr& ir, wire::FunctionIr* out) {
  out->Clear();
  EncodeFunction(ir, out);
}

std::string SerializeFunctionIr(const FunctionIr& ir) {
  wire::FunctionIr proto;
  ToProto(ir, &proto);
  return proto.SerializeAsString();
}

namespace {

absl::StatusOr<std::shared_ptr<const FunctionIr>> Decode(const wire::FunctionIr& proto,
                                                          int depth) {
  if (depth > kMaxNestingDepth) {
    return WireError(absl::StrFormat("loop bodies nest more than %d deep", kMaxNestingDepth));
  }
  PW_RETURN_IF_ERROR(CheckNoUnknownFields(proto, depth == 0 ? "the function"
                                                            : absl::StrCat("a body at depth ", depth)));
  FunctionBuilder b(proto.name(), proto.axis_name());
  if (proto.axis_size() != 0) {
    // Checked before SetAxisSize, which takes any n >= 1: ppermute allocates
    // per shard and all_to_all multiplies a dimension by the axis size.
    if (proto.axis_size() < 0 || proto.axis_size() > kMaxWireAxisSize) {
      return WireError(absl::StrFormat("axis_size %d is not in [1, %d]", proto.axis_size(),
                                       kMaxWireAxisSize));
    }
    PW_RETURN_IF_ERROR(b.SetAxisSize(proto.axis_size()));
  }
  std::vector<int32_t> params;
  wire::Op rebuilt;
  for (int i = 0; i < proto.ops_size(); ++i) {
    const wire::Op& w = proto.ops(i);
    PW_RETURN_IF_ERROR(CheckNoUnknownFields(w, absl::StrCat("op ", i)));
    const std::optional<OpKind> kind = FromWire(w.kind());
    if (!kind.has_value()) {
      return WireError(absl::StrFormat("op %d: unknown kind %d", i, static_cast<int>(w.kind())));
    }
    PW_RETURN_IF_ERROR(CheckOpShape(i, *kind, w));
    absl::StatusOr<int32_t> v = Replay(b, i, *kind, w, depth);
    if (!v.ok()) {
      // A nested function's own errors are already wire errors, naming
      // the op (DecodeNested).
      if (IsLoopOp(*kind) && absl::StartsWith(v.status().message(), "function wire: ")) {
        return v.status();
      }
      return BuilderError(i, v.status());
    }
    // One call, one new op: a conversion the builder inserted, or an
    // identity it elided, means the sender's op is not one it would make.
    if (*v != i || b.num_values() != i + 1) {
      return WireError(absl::StrFormat(
          "%s does not rebuild as one op (the builder gave %%%d and %d ops in all): its operands "
          "or attributes are not in the form FunctionBuilder makes them",
          OpLabel(i, *kind), *v, b.num_values()));
    }
    int rank = static_cast<int>(b.type(i).dims.size());
    for (const ValueType& e : b.type(i).elements) {
      rank = std::max(rank, static_cast<int>(e.dims.size()));
    }
    if (rank > kMaxWireRank) {
      return WireError(absl::StrFormat("%s: its result %s has rank %d, above %d",
                                       OpLabel(i, *kind), b.type(i).ToString(), rank,
                                       kMaxWireRank));
    }
    if (*kind == OpKind::kParameter) params.push_back(i);
  }
  if (!std::equal(params.begin(), params.end(), proto.params().begin(), proto.params().end())) {
    return WireError(absl::StrFormat("params lists %d values, which are not the %d parameter ops",
                                     proto.params_size(), params.size()));
  }
  absl::StatusOr<std::shared_ptr<const FunctionIr>> ir =
      b.Build(absl::MakeConstSpan(proto.outputs().data(), proto.outputs_size()));
  if (!ir.ok()) return WireError(ir.status().message());
  // Every op as the builder made it, re-encoded, must be the op received:
  // that rejects attributes its kind does not take, non-canonical ones
  // (a negative axis, unsorted axes) and any the builder would change.
  for (int i = 0; i < proto.ops_size(); ++i) {
    rebuilt.Clear();
    const Op& op = (*ir)->ops()[i];
    EncodeOp(op, /*with_literal=*/false, &rebuilt);
    PW_RETURN_IF_ERROR(CheckSameOp(i, op.kind, proto.ops(i), rebuilt));
  }
  return ir;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const FunctionIr>> FromProto(const wire::FunctionIr& proto) {
  return Decode(proto, 0);
}

absl::StatusOr<std::shared_ptr<const FunctionIr>> ParseFunctionIr(absl::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return WireError(absl::StrFormat("%d bytes, above protobuf's 2 GiB limit", bytes.size()));
  }
  wire::FunctionIr proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return WireError(
        absl::StrFormat("%d bytes that are not a serialized pw.wire.FunctionIr", bytes.size()));
  }
  return FromProto(proto);
}

}  // namespace pw
