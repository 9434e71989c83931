#ifndef PATHWAYS_FUNCTION_IR_OP_REGISTRY_H_
#define PATHWAYS_FUNCTION_IR_OP_REGISTRY_H_

// The op registry: every op of a compiled function's IR, defined once (as
// XLA's hlo_opcode.h). Everything per op in C++ derives from PW_OPS: the
// OpKind enum, the names in IR text and errors, the wire numbers
// (function_ir_wire.cc), the builder's type rules (function_ir.cc), the
// kernels' classification (kernels/), and the table the Python front end
// builds its Primitive objects from (bindings `op_registry()`; tests check
// each side against it). Adding an op: one line here, its builder method,
// its kernel, and its Primitive in python/pathways/_primitives.py.

#include <array>
#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace pw {

// What a kernel does with an op, which decides how the executable plans and
// runs it (kernels/) and how the front end emits it.
enum class OpClass : uint8_t {
  kSource,        // no kernel: parameters and constants
  kElementwise,   // each element from the same element of its operands (numpy broadcasting)
  kSimulated,     // identity that holds the gang's devices for a simulated time
  kReduction,     // over some axes of one shard
  kDataMovement,  // one strided-copy kernel within a shard
  kIndexing,      // take / scatter along an axis by int32 indices; top_k, sort
  kContraction,   // matmul
  kCollective,    // reads other shards of the gang, or the shard's position in it
  kControl,       // runs nested functions (scan, while), or names one result of such an op
  kLinalg,        // a decomposition of each matrix of the last two dims (LAPACK)
};

// How FunctionBuilder types an op's result from its operands.
enum class TypeRule : uint8_t {
  kArithmetic,   // binary: numpy promotion; true division and bool**bool as numpy
  kComparison,   // binary: operands promoted; result bool
  kBitwise,      // binary: bool or integer operands, promoted; logical on bool (numpy's bitwise_and ...)
  kShift,        // binary: integer operands (bools compute in int32), promoted
  kNumeric,      // unary: the operand's type; not bool
  kFloating,     // unary: float result (integers -> float64, bool -> float32), as numpy's ufuncs
  kInvert,       // unary: bool or integer operand, its type: bitwise not (logical on bool)
  kSame,         // the (first) operand's type
  kIndices,      // int32 positions in the operand, whatever its type: no gradient flows
  kOwn,          // computed by the op's own builder method from its parameters
};

// X(Enum, "name", WIRE, arity, OpClass, TypeRule): arity -1 is variadic (one
// or more operands; kScan takes zero or more).
// WIRE is the proto's enumerator without its OP_ prefix (function_ir.proto
// numbers them independently of this order).
#define PW_OPS(X)                                                                      \
  X(kParameter, "parameter", PARAMETER, 0, kSource, kOwn)                              \
  X(kConstant, "constant", CONSTANT, 0, kSource, kOwn)                                 \
  X(kConvert, "convert", CONVERT, 1, kElementwise, kOwn)                               \
  X(kAdd, "add", ADD, 2, kElementwise, kArithmetic)                                    \
  X(kSub, "sub", SUB, 2, kElementwise, kArithmetic)                                    \
  X(kMul, "mul", MUL, 2, kElementwise, kArithmetic)                                    \
  X(kDiv, "div", DIV, 2, kElementwise, kArithmetic)                                    \
  X(kPow, "pow", POW, 2, kElementwise, kArithmetic)                                    \
  /* The remainder of truncated division, with a's sign (C's fmod and %, jax.lax.rem);  \
     an integer remainder by 0 is a, as XLA's */                                       \
  X(kRem, "rem", REM, 2, kElementwise, kArithmetic)                                    \
  /* atan2(y, x): the angle of the point (x, y), C's; integers in float64, bool in     \
     float32 (the builder converts) */                                                 \
  X(kAtan2, "atan2", ATAN2, 2, kElementwise, kArithmetic)                              \
  X(kMax, "max", MAX, 2, kElementwise, kArithmetic)                                    \
  X(kMin, "min", MIN, 2, kElementwise, kArithmetic)                                    \
  X(kEq, "eq", EQ, 2, kElementwise, kComparison)                                       \
  X(kNe, "ne", NE, 2, kElementwise, kComparison)                                       \
  X(kLt, "lt", LT, 2, kElementwise, kComparison)                                       \
  X(kLe, "le", LE, 2, kElementwise, kComparison)                                       \
  X(kGt, "gt", GT, 2, kElementwise, kComparison)                                       \
  X(kGe, "ge", GE, 2, kElementwise, kComparison)                                       \
  X(kAnd, "and", AND, 2, kElementwise, kBitwise)                                       \
  X(kOr, "or", OR, 2, kElementwise, kBitwise)                                          \
  X(kXor, "xor", XOR, 2, kElementwise, kBitwise)                                       \
  /* Shift counts outside [0, bit width) give 0, or the sign for arithmetic right      \
     shifts (as XLA; a negative count is taken as unsigned, so out of range) */        \
  X(kShiftLeft, "shift_left", SHIFT_LEFT, 2, kElementwise, kShift)                     \
  X(kShiftRightLogical, "shift_right_logical", SHIFT_RIGHT_LOGICAL, 2, kElementwise,   \
    kShift)                                                                            \
  X(kShiftRightArithmetic, "shift_right_arithmetic", SHIFT_RIGHT_ARITHMETIC, 2,        \
    kElementwise, kShift)                                                              \
  X(kNeg, "neg", NEG, 1, kElementwise, kNumeric)                                       \
  X(kAbs, "abs", ABS, 1, kElementwise, kNumeric)                                       \
  X(kExp, "exp", EXP, 1, kElementwise, kFloating)                                      \
  X(kLog, "log", LOG, 1, kElementwise, kFloating)                                      \
  X(kTanh, "tanh", TANH, 1, kElementwise, kFloating)                                   \
  X(kSqrt, "sqrt", SQRT, 1, kElementwise, kFloating)                                   \
  X(kRsqrt, "rsqrt", RSQRT, 1, kElementwise, kFloating)                                \
  X(kSin, "sin", SIN, 1, kElementwise, kFloating)                                      \
  X(kCos, "cos", COS, 1, kElementwise, kFloating)                                      \
  X(kErf, "erf", ERF, 1, kElementwise, kFloating)                                      \
  X(kErfc, "erfc", ERFC, 1, kElementwise, kFloating)                                   \
  /* tan, the inverse and the hyperbolic trigonometric functions: C's, float computed   \
     in double and rounded once */                                                     \
  X(kTan, "tan", TAN, 1, kElementwise, kFloating)                                      \
  X(kAsin, "asin", ASIN, 1, kElementwise, kFloating)                                   \
  X(kAcos, "acos", ACOS, 1, kElementwise, kFloating)                                   \
  X(kAtan, "atan", ATAN, 1, kElementwise, kFloating)                                   \
  X(kSinh, "sinh", SINH, 1, kElementwise, kFloating)                                   \
  X(kCosh, "cosh", COSH, 1, kElementwise, kFloating)                                   \
  X(kAsinh, "asinh", ASINH, 1, kElementwise, kFloating)                                \
  X(kAcosh, "acosh", ACOSH, 1, kElementwise, kFloating)                                \
  X(kAtanh, "atanh", ATANH, 1, kElementwise, kFloating)                                \
  X(kNot, "not", NOT, 1, kElementwise, kInvert)                                        \
  /* The operand's bits as Op::type.dtype, of the same size (jax.lax's name) */        \
  X(kBitcastConvert, "bitcast_convert_type", BITCAST_CONVERT_TYPE, 1, kElementwise,    \
    kOwn)                                                                              \
  /* where(cond, x, y): cond bool; numpy broadcasting of all three */                  \
  X(kSelect, "select", SELECT, 3, kElementwise, kOwn)                                  \
  /* Identity; the gang holds its devices at least the sum of these durations */       \
  X(kSimulatedCompute, "simulated_compute", SIMULATED_COMPUTE, 1, kSimulated, kSame)   \
  /* Op::reduce_kind over Op::axes of one shard, keeping size-1 dims when keepdims */  \
  X(kReduce, "reduce", REDUCE, 1, kReduction, kOwn)                                    \
  /* Running Op::combiner (add, mul, max, min) along Op::axis, from the end when       \
     Op::reverse: numpy's cumsum, cumprod and ufunc.accumulate */                      \
  X(kCumulative, "cumulative", CUMULATIVE, 1, kReduction, kOwn)                        \
  /* --- Data movement within a shard --- */                                           \
  X(kCopy, "copy", COPY, 1, kDataMovement, kSame)                                      \
  X(kReshape, "reshape", RESHAPE, 1, kDataMovement, kOwn)                              \
  X(kBroadcastTo, "broadcast_to", BROADCAST_TO, 1, kDataMovement, kOwn)                \
  X(kTranspose, "transpose", TRANSPOSE, 1, kDataMovement, kOwn) /* by Op::axes */      \
  X(kSlice, "slice", SLICE, 1, kDataMovement, kOwn)                                    \
  X(kRev, "rev", REV, 1, kDataMovement, kSame) /* reversed along Op::axes */           \
  X(kPad, "pad", PAD, 1, kDataMovement, kOwn) /* zeros around and between */           \
  X(kConcatenate, "concatenate", CONCATENATE, -1, kDataMovement, kOwn)                 \
  /* take(x, indices, axis): indices clipped to [0, x.dims[axis]) */                   \
  X(kTake, "take", TAKE, 2, kIndexing, kOwn)                                           \
  /* scatter(operand, indices, updates, axis): operand (or a scalar broadcast to the   \
     result) with updates combined in by Op::combiner (set, add, mul, max, min) at the \
     indices along the axis; indices out of range are skipped. The transpose of take   \
     (add into zeros), and x.at[i].set/add/... */                                      \
  X(kScatter, "scatter", SCATTER, 3, kIndexing, kOwn)                                  \
  /* Positions (Op::type's last dim: k) of the k largest along the last axis,          \
     largest first, ties lower position first; floats in IEEE totalOrder (as           \
     XLA's TopK): NaN above +inf (below -inf with its sign set), -0 below +0 */        \
  X(kTopK, "top_k", TOP_K, 1, kIndexing, kIndices)                                     \
  /* Positions that sort each row along the last axis, stably (equal elements in       \
     increasing position), in numpy's order: NaN last (first when Op::reverse,         \
     descending), -0 equal to +0 */                                                    \
  X(kSort, "sort", SORT, 1, kIndexing, kIndices)                                       \
  /* numpy matmul of two values of rank >= 2: batch dims broadcast */                  \
  X(kMatmul, "matmul", MATMUL, 2, kContraction, kOwn)                                  \
  /* --- Across the shards of the gang (the pmap axis) --- */                          \
  X(kPsum, "psum", PSUM, 1, kCollective, kSame)                                        \
  X(kPmean, "pmean", PMEAN, 1, kCollective, kSame)                                     \
  X(kPmax, "pmax", PMAX, 1, kCollective, kSame)                                        \
  X(kPmin, "pmin", PMIN, 1, kCollective, kSame)                                        \
  X(kAxisIndex, "axis_index", AXIS_INDEX, 0, kCollective, kOwn)                        \
  /* Every shard's value stacked along a new axis Op::axis */                          \
  X(kAllGather, "all_gather", ALL_GATHER, 1, kCollective, kOwn)                        \
  /* Shard Op::perm_source[d] sends its value to shard d (zeros where -1) */           \
  X(kPpermute, "ppermute", PPERMUTE, 1, kCollective, kSame)                            \
  /* JAX all_to_all: split along Op::axis, chunk d to shard d, join on concat_axis */  \
  X(kAllToAll, "all_to_all", ALL_TO_ALL, 1, kCollective, kOwn)                         \
  /* JAX psum_scatter (tiled=False) along Op::axis */                                  \
  X(kPsumScatter, "psum_scatter", PSUM_SCATTER, 1, kCollective, kOwn)                 \
  /* --- Control flow (function_ir.h: "Loops") --- */                                  \
  /* Runs Op::body Op::length times over carries, slices of xs and consts; its value   \
     is a tuple (final carries, stacked ys) that get_element ops take apart */         \
  X(kScan, "scan", SCAN, -1, kControl, kOwn)                                           \
  /* Runs Op::body over the carries (the first Op::num_carries operands) and consts    \
     while Op::cond of them is true (a trip count known only on the device, as XLA's   \
     While); its value is the tuple of final carries */                                \
  X(kWhile, "while", WHILE, -1, kControl, kOwn)                                        \
  /* Element Op::index of a tuple value (the only op that reads one) */                \
  X(kGetElement, "get_element", GET_ELEMENT, 1, kControl, kOwn)                       \
  /* --- Linear algebra, per matrix of the last two dims --- */                        \
  /* Singular value decomposition x = u diag(s) vt of float32/float64 [..., m, n]:     \
     the tuple (u [..., m, m or k], s [..., k] descending, vt [..., n or k, n]),       \
     k = min(m, n), square u and vt when Op::full_matrices (LAPACK's gesdd); NaN       \
     everywhere for a matrix with a NaN or inf */                                      \
  X(kSvd, "svd", SVD, 1, kLinalg, kOwn)                                                \
  /* LU decomposition with partial pivoting of float32/float64 square [..., n, n]      \
     (LAPACK's getrf): the tuple (lu [..., n, n]: L below the diagonal, its unit       \
     diagonal implied, U on and above it; pivots i32 [..., n]: row i was swapped with  \
     row pivots[i], in turn; permutation i32 [..., n]: x[permutation] = L U) */        \
  X(kLu, "lu", LU, 1, kLinalg, kOwn)                                                   \
  /* x with op(a) x = b, a [..., n, n] triangular (Op::lower; its diagonal taken as    \
     ones when Op::unit_diagonal; the other triangle never read), b [..., n, k] of     \
     the same batch dims and dtype (float32/float64), op(a) = a^T when                 \
     Op::transpose_a (BLAS's trsm) */                                                  \
  X(kTriangularSolve, "triangular_solve", TRIANGULAR_SOLVE, 2, kLinalg, kOwn)           \
  /* Eigendecomposition of the symmetric matrices whose lower triangles are those of   \
     float32/float64 square [..., n, n] (the upper never read; LAPACK's syevd): the    \
     tuple (w [..., n] ascending, v [..., n, n] with the eigenvectors as columns);     \
     NaN in both for a matrix with a NaN or inf */                                     \
  X(kEigh, "eigh", EIGH, 1, kLinalg, kOwn)                                             \
  /* Cholesky factor L (lower, L L^T = x) of the symmetric matrices whose lower        \
     triangles are those of float32/float64 square [..., n, n] (LAPACK's potrf); NaN   \
     where a matrix is not positive definite, as JAX */                                \
  X(kCholesky, "cholesky", CHOLESKY, 1, kLinalg, kSame)                                \
  /* QR decomposition of float32/float64 [..., m, n] (LAPACK's geqrf and orgqr): the   \
     tuple (q [..., m, k] orthonormal columns, r [..., k, n] upper triangular),        \
     k = min(m, n), or q [..., m, m] and r [..., m, n] when Op::full_matrices; NaN in  \
     both for a matrix with a NaN or inf */                                            \
  X(kQr, "qr", QR, 1, kLinalg, kOwn)

enum class OpKind : uint8_t {
#define PW_OP_ENUMERATOR(e, name, wire, arity, cls, rule) e,
  PW_OPS(PW_OP_ENUMERATOR)
#undef PW_OP_ENUMERATOR
};

// One row of the registry.
struct OpInfo {
  OpKind kind;
  absl::string_view name;  // as printed in IR text and error messages
  int arity;               // number of operands; -1: one or more
  OpClass op_class;
  TypeRule type_rule;
};

inline constexpr OpInfo kOpRegistry[] = {
#define PW_OP_ROW(e, name, wire, arity, cls, rule) \
  OpInfo{OpKind::e, name, arity, OpClass::cls, TypeRule::rule},
    PW_OPS(PW_OP_ROW)
#undef PW_OP_ROW
};

inline constexpr int kNumOpKinds = static_cast<int>(std::size(kOpRegistry));

inline constexpr const OpInfo& GetOpInfo(OpKind kind) {
  return kOpRegistry[static_cast<int>(kind)];
}

// "add", "psum", ... ("unknown" for a value outside the enum).
inline absl::string_view OpKindName(OpKind kind) {
  const int i = static_cast<int>(kind);
  return i < kNumOpKinds ? kOpRegistry[i].name : "unknown";
}

// The op named `name`, or nullopt.
std::optional<OpKind> OpKindFromName(absl::string_view name);

inline constexpr OpClass GetOpClass(OpKind kind) { return GetOpInfo(kind).op_class; }
inline constexpr TypeRule GetTypeRule(OpKind kind) { return GetOpInfo(kind).type_rule; }

// FunctionBuilder::Binary's ops: elementwise with arity 2.
inline constexpr bool IsBinaryOp(OpKind kind) {
  return GetOpClass(kind) == OpClass::kElementwise && GetOpInfo(kind).arity == 2;
}
// FunctionBuilder::Unary's ops: elementwise with arity 1, except convert and
// bitcast_convert_type.
inline constexpr bool IsUnaryOp(OpKind kind) {
  return GetOpClass(kind) == OpClass::kElementwise && GetOpInfo(kind).arity == 1 &&
         GetTypeRule(kind) != TypeRule::kOwn;
}
// A loop: an op that runs nested functions (function_ir.h, "Loops").
inline constexpr bool IsLoopOp(OpKind kind) {
  return kind == OpKind::kScan || kind == OpKind::kWhile;
}
// An op whose result on one shard depends on other shards or on the shard's
// position in the gang.
inline constexpr bool IsCollectiveOp(OpKind kind) {
  return GetOpClass(kind) == OpClass::kCollective;
}

// The registry's version: a hash (FNV-1a) of every row, in order: its name,
// its wire enumerator's name, its arity, class and type rule. A client and
// its hosts exchange it in their Hello (coordination/protocol_version.h): two
// builds whose registries differ would read each other's function IR as
// other ops, so they refuse to work together. (The wire numbers themselves
// live in function_ir.proto; renumbering one is a change of the control
// protocol's version.)
namespace op_registry_internal {
constexpr uint64_t Fnv1a(uint64_t hash, absl::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    hash = (hash ^ static_cast<uint8_t>(bytes[i])) * 0x100000001b3ull;
  }
  return (hash ^ 0xff) * 0x100000001b3ull;  // ends the field: "ab","c" is not "a","bc"
}
constexpr uint64_t Fnv1a(uint64_t hash, int64_t value) {
  for (int i = 0; i < 8; ++i) {
    hash = (hash ^ static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i))) * 0x100000001b3ull;
  }
  return hash;
}
inline constexpr absl::string_view kWireNames[] = {
#define PW_OP_WIRE_NAME(e, name, wire, arity, cls, rule) #wire,
    PW_OPS(PW_OP_WIRE_NAME)
#undef PW_OP_WIRE_NAME
};
constexpr uint64_t RegistryHash() {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpInfo& op = kOpRegistry[i];
    hash = Fnv1a(hash, op.name);
    hash = Fnv1a(hash, kWireNames[i]);
    hash = Fnv1a(hash, static_cast<int64_t>(op.arity));
    hash = Fnv1a(hash, static_cast<int64_t>(op.op_class));
    hash = Fnv1a(hash, static_cast<int64_t>(op.type_rule));
  }
  return hash;
}
}  // namespace op_registry_internal

inline constexpr uint64_t kOpRegistryVersion = op_registry_internal::RegistryHash();

// The registry's rows are in enum order (GetOpInfo indexes by the enum).
static_assert([] {
  for (int i = 0; i < kNumOpKinds; ++i) {
    if (static_cast<int>(kOpRegistry[i].kind) != i) return false;
  }
  return true;
}());

}  // namespace pw

#endif  // PATHWAYS_FUNCTION_IR_OP_REGISTRY_H_
