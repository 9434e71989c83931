#include "csrc/codegen/fused_region.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pw::codegen {
namespace {

// The columns a pass over a row computes at a time: values of the pass that
// are not inlined live in arrays of this many elements (on the stack, in L1).
constexpr int64_t kChunk = 256;
// The most row buffer one reduction may need (its operand's row); a region
// whose rows are longer does not fuse its reductions.
constexpr int64_t kMaxRowBufferBytes = 512 << 10;
// The most row buffer a region may use in all (it is on the stack of each
// call): a region that needs more is not made.
constexpr int64_t kMaxStackRowBufferBytes = 1 << 20;

bool Inert(const Op& op) { return op.kind == OpKind::kParameter || op.kind == OpKind::kConstant; }

bool Computing(DType d) { return d != DType::kBF16; }

// Transcendentals the runtime computes with its vector math.
const char* VectorMathName(OpKind kind) {
  switch (kind) {
    case OpKind::kExp: return "exp";
    case OpKind::kLog: return "log";
    case OpKind::kTanh: return "tanh";
    case OpKind::kSqrt: return "sqrt";
    case OpKind::kRsqrt: return "rsqrt";
    case OpKind::kSin: return "sin";
    case OpKind::kCos: return "cos";
    case OpKind::kErf: return "erf";
    case OpKind::kErfc: return "erfc";
    default: return nullptr;
  }
}

// Those C's libm computes in double (the interpreter's RunUnary).
const char* LibmName(OpKind kind) {
  switch (kind) {
    case OpKind::kTan: return "tan";
    case OpKind::kAsin: return "asin";
    case OpKind::kAcos: return "acos";
    case OpKind::kAtan: return "atan";
    case OpKind::kSinh: return "sinh";
    case OpKind::kCosh: return "cosh";
    case OpKind::kAsinh: return "asinh";
    case OpKind::kAcosh: return "acosh";
    case OpKind::kAtanh: return "atanh";
    default: return nullptr;
  }
}

bool ElementwiseSupported(OpKind kind) {
  switch (kind) {
    case OpKind::kConvert: case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul:
    case OpKind::kDiv: case OpKind::kPow: case OpKind::kRem: case OpKind::kAtan2:
    case OpKind::kMax: case OpKind::kMin: case OpKind::kEq: case OpKind::kNe:
    case OpKind::kLt: case OpKind::kLe: case OpKind::kGt: case OpKind::kGe:
    case OpKind::kAnd: case OpKind::kOr: case OpKind::kXor: case OpKind::kShiftLeft:
    case OpKind::kShiftRightLogical: case OpKind::kShiftRightArithmetic: case OpKind::kNeg:
    case OpKind::kAbs: case OpKind::kNot: case OpKind::kSelect:
      return true;
    default:
      return VectorMathName(kind) != nullptr || LibmName(kind) != nullptr;
  }
}

// Whether the region may contain op v at all (before any shape reasoning).
bool Candidate(absl::Span<const Op> ops, int32_t v) {
  const Op& op = ops[v];
  if (op.type.is_tuple() || !Computing(op.type.dtype)) return false;
  for (int32_t u : op.operands) {
    if (ops[u].type.is_tuple() || !Computing(ops[u].type.dtype)) return false;
  }
  switch (op.kind) {
    case OpKind::kReshape:
    case OpKind::kBroadcastTo:
      return true;
    case OpKind::kReduce:
      return (op.type.dtype == DType::kF32 || op.type.dtype == DType::kF64) &&
             ops[op.operands[0]].type.dtype == op.type.dtype &&
             op.reduce_kind != ReduceKind::kArgmax;
    default:
      return ElementwiseSupported(op.kind);
  }
}

Dims RowMajor(const Dims& d) {
  Dims st(d.size(), 0);
  int64_t s = 1;
  for (size_t i = d.size(); i-- > 0;) {
    st[i] = s;
    s *= d[i];
  }
  return st;
}

// The strides over L at which numpy broadcasting reads a value of dims `own`.
std::optional<Dims> Bcast(Dims own, const Dims& L) {
  while (own.size() > L.size() && own.front() == 1) own.erase(own.begin());
  if (own.size() > L.size()) return std::nullopt;
  const Dims rm = RowMajor(own);
  Dims st(L.size(), 0);
  const size_t off = L.size() - own.size();
  for (size_t j = 0; j < own.size(); ++j) {
    const size_t d = off + j;
    if (own[j] == L[d]) {
      st[d] = L[d] == 1 ? 0 : rm[j];
    } else if (own[j] != 1) {
      return std::nullopt;
    }
  }
  return st;
}

bool Same(const Dims& a, const Dims& b, const Dims& L) {
  for (size_t d = 0; d < L.size(); ++d) {
    if (L[d] != 1 && a[d] != b[d]) return false;
  }
  return true;
}

const char* CType(DType d) {
  switch (d) {
    case DType::kF32: return "float";
    case DType::kF64: return "double";
    case DType::kI32: return "int32_t";
    case DType::kU32: return "uint32_t";
    case DType::kBool: return "bool";
    case DType::kBF16: break;
  }
  return "void";
}

const char* DTypeSuffix(DType d) { return d == DType::kF64 ? "f64" : "f32"; }

// A scalar constant's value as an exact C++ expression.
std::string Literal(const Op& op) {
  const uint8_t* p = op.literal.data();
  switch (op.type.dtype) {
    case DType::kF32: {
      uint32_t bits;
      std::memcpy(&bits, p, 4);
      return absl::StrFormat("std::bit_cast<float>(0x%08xu)", bits);
    }
    case DType::kF64: {
      uint64_t bits;
      std::memcpy(&bits, p, 8);
      return absl::StrFormat("std::bit_cast<double>(0x%016xull)", bits);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return absl::StrFormat("static_cast<int32_t>(0x%08xu)", static_cast<uint32_t>(v));
    }
    case DType::kU32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return absl::StrFormat("uint32_t(0x%08xu)", v);
    }
    case DType::kBool:
      return p[0] != 0 ? "true" : "false";
    case DType::kBF16:
      break;
  }
  return "0";
}

// The planner's and emitter's view of one value of a region.
struct Info {
  enum Kind : uint8_t { kUnseen, kExternal, kComputed, kAlias };
  Kind kind = kUnseen;
  bool literal = false;   // a scalar constant, written into the code
  bool has_st = false;    // kExternal: st is known (from its first reader)
  Dims st;                // element strides over L
  int32_t mem = -1;       // kExternal: the op whose memory holds it
  int32_t target = -1;    // kAlias: the value whose elements it has
  int32_t first_use = -1;  // kExternal: the first op reading it
  // Set by the emitter.
  Access access = Access::kFull;
  bool column = false;  // computed per column (kFull, kCol), else per row
  int pass = 0;         // column values: the pass computing it; row values: the pass it is ready at
  int reduce_pass = -1;  // kReduce: the pass at whose end it reduces
  int io = -1;           // kExternal: its input; computed: its output, or -1
  int64_t buffer = -1;   // a row buffer (byte offset), for later passes or a reduction
  int uses = 0;          // readers in the region
  bool inline_expr = false;
};

class Planner {
 public:
  Planner(const FunctionIr& ir, absl::Span<const std::pair<int32_t, int32_t>> groups)
      : ops_(ir.ops()) {
    const int32_t n = static_cast<int32_t>(ops_.size());
    group_first_.assign(n, -1);
    group_last_.assign(n, -1);
    for (const auto& [a, b] : groups) {
      for (int32_t u = a; u <= b; ++u) {
        group_first_[u] = a;
        group_last_[u] = b;
      }
    }
    last_user_.assign(n, -1);
    for (int32_t v = 0; v < n; ++v) {
      for (int32_t u : ops_[v].operands) last_user_[u] = std::max(last_user_[u], v);
    }
    for (int32_t v : ir.outputs()) last_user_[v] = n;
  }

  std::vector<FusedRegion> Plan() {
    std::vector<FusedRegion> regions;
    const int32_t n = static_cast<int32_t>(ops_.size());
    for (int32_t v = 0; v < n;) {
      if (Inert(ops_[v]) || !Candidate(ops_, v) || (group_first_[v] >= 0 && group_first_[v] < v)) {
        ++v;
        continue;
      }
      int32_t limit = v;
      for (int32_t next = v + 1; next < n; ++next) {
        if (Inert(ops_[next])) continue;
        if (!Candidate(ops_, next)) break;
        limit = next;
      }
      std::optional<FusedRegion> region;
      while (limit >= v) {
        int32_t failed = -1;
        region = Try(v, limit, &failed);
        // A region ends where an interpreter group does, or outside one.
        if (region.has_value() && group_last_[region->last] > region->last) {
          failed = group_first_[region->last];
          region.reset();
          if (failed <= v) break;
        }
        if (region.has_value() || failed < 0) break;
        limit = failed - 1;
      }
      if (region.has_value()) {
        v = region->last + 1;
        regions.push_back(std::move(*region));
      } else {
        ++v;
      }
    }
    return regions;
  }

 private:
  // A region of ops [v, limit] or a prefix of it; nullopt with *failed set
  // to the op to stop before, or -1 when no prefix can be one.
  std::optional<FusedRegion> Try(int32_t v, int32_t limit, int32_t* failed);

  absl::Span<const Op> ops_;
  std::vector<int32_t> last_user_;
  // Per op: the interpreter fusion group holding it (its first and last
  // op), or -1.
  std::vector<int32_t> group_first_, group_last_;
};

// The code of one region, built by Emitter::Emit.
class Emitter {
 public:
  // `info` holds ops [base, last]'s, from the planner.
  Emitter(absl::Span<const Op> ops, std::vector<Info>& info, int32_t base, int32_t first,
          int32_t last, int64_t rows, int64_t cols)
      : ops_(ops), info_(info), first_(first), last_(last), rows_(rows), cols_(cols), base_(base) {}
  std::string Emit(const FusedRegion& region, int64_t* row_buffer_bytes);

 private:
  Info& I(int32_t v) { return info_[static_cast<size_t>(v - base_)]; }
  const Op& O(int32_t v) const { return ops_[v]; }
  // The value whose storage or code gives v's elements (through aliases).
  int32_t Resolve(int32_t v) {
    while (I(v).kind == Info::kAlias) v = I(v).target;
    return v;
  }
  std::string ColumnExpr(int32_t v, int pass);
  std::string RowExpr(int32_t v);
  std::string OpExpr(int32_t v, const std::vector<std::string>& a);
  // A pointer to `len` consecutive column values of v in pass `pass`, or ""
  // when there is no array to point to.
  std::string ColumnArray(int32_t v, int pass);

  absl::Span<const Op> ops_;
  std::vector<Info>& info_;
  int32_t first_, last_;
  int64_t rows_, cols_;
  int32_t base_;
};

std::optional<FusedRegion> Planner::Try(int32_t v, int32_t limit, int32_t* failed) {
  *failed = -1;
  // L: the region's largest value (a reduction's operand counts).
  Dims L;
  int64_t largest = -1;
  for (int32_t u = v; u <= limit; ++u) {
    const Op& op = ops_[u];
    if (Inert(op)) continue;
    const Dims& d = op.kind == OpKind::kReduce ? ops_[op.operands[0]].type.dims : op.type.dims;
    if (NumElements(d) > largest) {
      largest = NumElements(d);
      L = d;
    }
  }
  if (largest <= 0) return std::nullopt;  // empty values: nothing to compute
  // Values the region reads from before it: from the first operand index.
  int32_t base = v;
  for (int32_t u = v; u <= limit; ++u) {
    for (int32_t w : ops_[u].operands) base = std::min(base, w);
  }
  std::vector<Info> info(static_cast<size_t>(limit - base + 1));
  auto I = [&](int32_t u) -> Info& { return info[static_cast<size_t>(u - base)]; };
  const Dims rmL = RowMajor(L);
  const size_t k = L.size();
  int64_t cols = -1;  // set by the first reduction
  int32_t last = v - 1;
  int computing = 0;
  bool has_reduce = false;

  auto external = [&](int32_t w, int32_t reader) -> Info& {
    Info& e = I(w);
    if (e.kind == Info::kUnseen) {
      e.kind = Info::kExternal;
      e.mem = w;
      e.first_use = reader;
      const Op& wo = ops_[w];
      e.literal = wo.kind == OpKind::kConstant && NumElements(wo.type.dims) == 1;
    }
    return e;
  };
  // Operand w of op u read at strides `req` over L.
  auto read = [&](int32_t w, int32_t u, const Dims& req) {
    Info& e = (w >= v && I(w).kind != Info::kUnseen) ? I(w) : external(w, u);
    if (e.literal) return true;
    if (e.kind == Info::kExternal) {
      if (e.has_st) return Same(e.st, req, L);
      e.st = req;
      e.has_st = true;
      return true;
    }
    return Same(e.st, req, L);
  };
  auto in_region = [&](int32_t w) {
    return w >= v && (I(w).kind == Info::kComputed || I(w).kind == Info::kAlias);
  };

  for (int32_t u = v; u <= limit; ++u) {
    const Op& op = ops_[u];
    if (Inert(op)) continue;
    Info& me = I(u);
    bool ok = true;
    // What this op changes, restored if it cannot join.
    absl::InlinedVector<std::pair<int32_t, Info>, 4> saved;
    for (int32_t w : op.operands) saved.push_back({w, I(w)});
    const Dims& D = op.type.dims;
    if (op.kind == OpKind::kReshape) {
      const int32_t w = op.operands[0];
      if (in_region(w)) {
        me.kind = Info::kAlias;
        me.target = w;
        me.st = I(w).st;
      } else {
        // Read from w's memory in its own shape; not written by the region,
        // so nothing after the region may read it (checked at the end).
        const Info& src = external(w, u);
        me.kind = Info::kExternal;
        me.mem = src.literal ? w : src.mem;
        me.literal = src.literal;
        me.first_use = u;
      }
    } else if (op.kind == OpKind::kBroadcastTo) {
      const int32_t w = op.operands[0];
      const auto req = Bcast(ops_[w].type.dims, L);
      const auto st = Bcast(D, L);
      ok = req.has_value() && st.has_value() &&
           (D == L || NumElements(ops_[w].type.dims) == 1) && read(w, u, *req);
      if (ok) {
        me.kind = Info::kAlias;
        me.target = w;
        me.st = *st;
      }
    } else if (op.kind == OpKind::kReduce) {
      const int32_t w = op.operands[0];
      const Dims& wd = ops_[w].type.dims;
      // The reduced axes must be the trailing ones (size-1 dims aside).
      int64_t red = 1;
      bool trailing = true;
      size_t a = 0;
      bool in_reduced = false;
      for (size_t d = 0; d < wd.size(); ++d) {
        const bool reduced = a < op.axes.size() && op.axes[a] == static_cast<int64_t>(d);
        if (reduced) {
          ++a;
          red *= wd[d];
          if (wd[d] != 1) in_reduced = true;
        } else if (in_reduced && wd[d] != 1) {
          trailing = false;
        }
      }
      // Its operand: read from memory, or a value the region computes per
      // column (kept in a row buffer), not an alias of a row value.
      int32_t src = w;
      while (src >= v && I(src).kind == Info::kAlias) src = I(src).target;
      const bool columnar = !(src >= v && I(src).kind == Info::kComputed) || Same(I(src).st, rmL, L);
      ok = columnar && trailing && red > 0 && NumElements(wd) == NumElements(L) &&
           red * 8 <= kMaxRowBufferBytes && (cols < 0 || cols == red) && read(w, u, rmL);
      // The split: L's trailing dims whose product is `red`.
      size_t p = k;
      if (ok) {
        int64_t prod = 1;
        while (p > 0 && prod < red) prod *= L[--p];
        while (p > 0 && L[p - 1] == 1) --p;
        ok = prod == red;
      }
      if (ok) {
        cols = red;
        has_reduce = true;
        me.kind = Info::kComputed;
        me.st = Dims(k, 0);
        for (size_t d = 0; d < p; ++d) me.st[d] = rmL[d] / red;
      }
    } else {  // elementwise
      if (D == L) {
        for (int32_t w : op.operands) {
          const auto req = Bcast(ops_[w].type.dims, L);
          if (!req.has_value() || !read(w, u, *req)) ok = false;
        }
        me.st = rmL;
      } else {
        std::optional<Dims> common;
        for (int32_t w : op.operands) {
          if (NumElements(ops_[w].type.dims) == 1 && !in_region(w)) continue;
          if (ops_[w].type.dims != D && NumElements(ops_[w].type.dims) != 1) ok = false;
          if (ok && in_region(w) && ops_[w].type.dims == D) {
            if (common.has_value() && !Same(*common, I(w).st, L)) ok = false;
            common = I(w).st;
          }
        }
        if (!common.has_value()) common = Bcast(D, L);
        ok = ok && common.has_value();
        for (int32_t w : op.operands) {
          if (!ok) break;
          const Dims req =
              NumElements(ops_[w].type.dims) == 1 ? Dims(k, 0) : *common;
          if (!read(w, u, req)) ok = false;
        }
        if (ok) me.st = *common;
      }
      if (ok) me.kind = Info::kComputed;
    }
    if (!ok) {
      for (auto it = saved.rbegin(); it != saved.rend(); ++it) I(it->first) = it->second;
      me = Info();
      break;
    }
    last = u;
    if (me.kind != Info::kExternal) ++computing;
  }
  // A reshape the region reads in place of computing it leaves its own slot
  // unwritten: none may be read after the region.
  for (int32_t u = v; u <= last; ++u) {
    if (!Inert(ops_[u]) && I(u).kind == Info::kExternal && last_user_[u] > last) {
      *failed = u > v ? u : -1;
      return std::nullopt;
    }
  }
  if (last < v || (computing < 2 && !has_reduce)) return std::nullopt;

  // The split into rows and columns: a reduction's, else the first that
  // classifies every value.
  auto classify = [&](const Dims& st, size_t p, Access* access) {
    bool full = true, scalar = true, row = true, col = true;
    for (size_t d = 0; d < k; ++d) {
      if (L[d] == 1) continue;
      const int64_t inner = d < p ? 0 : rmL[d];
      const int64_t outer = d < p ? rmL[d] / NumElements(Dims(L.begin() + p, L.end())) : 0;
      full = full && st[d] == rmL[d];
      scalar = scalar && st[d] == 0;
      row = row && st[d] == outer;
      col = col && st[d] == inner;
    }
    if (scalar) *access = Access::kScalar;
    else if (full) *access = Access::kFull;
    else if (row) *access = Access::kRow;
    else if (col) *access = Access::kCol;
    else return false;
    return true;
  };
  auto first_unclassified = [&](size_t p) {
    int32_t bad = -1;
    for (int32_t u = base; u <= last; ++u) {
      Info& e = I(u);
      if (e.kind == Info::kUnseen || e.literal) continue;
      if (e.kind == Info::kExternal && !e.has_st) continue;  // a reshape nobody in the region read
      const int32_t at = e.kind == Info::kExternal ? e.first_use : u;
      if (!classify(e.st, p, &e.access) && (bad < 0 || at < bad)) bad = at;
    }
    return bad;
  };
  size_t split = 0;
  int32_t bad = -1;
  if (has_reduce) {
    int64_t prod = 1;
    split = k;
    while (split > 0 && prod < cols) prod *= L[--split];
    bad = first_unclassified(split);
  } else {
    // The first split that classifies every value (the longest rows), else
    // stop before the op that fails latest over the splits.
    for (size_t p = 0; p <= k; ++p) {
      const int32_t b = first_unclassified(p);
      if (b < 0) {
        split = p;
        bad = -1;
        break;
      }
      bad = std::max(bad, b);
    }
  }
  if (bad >= 0) {
    *failed = bad > v ? bad : -1;
    return std::nullopt;
  }
  FusedRegion region;
  region.first = v;
  region.last = last;
  region.cols = NumElements(Dims(L.begin() + split, L.end()));
  region.rows = NumElements(Dims(L.begin(), L.begin() + split));
  // Inputs: externals that a region op reads (in first-use order); outputs:
  // region values used after it.
  for (int32_t u = base; u <= last; ++u) {
    Info& e = I(u);
    if (e.kind == Info::kExternal && !e.literal && e.has_st) {
      e.io = static_cast<int>(region.inputs.size());
      region.inputs.push_back({e.mem, e.access, ops_[u].type.dtype});
    }
    if ((e.kind == Info::kComputed || e.kind == Info::kAlias) && last_user_[u] > last) {
      e.io = static_cast<int>(region.outputs.size());
      region.outputs.push_back({u, e.access, ops_[u].type.dtype});
    }
  }
  if (region.inputs.size() > kMaxRegionIo || region.outputs.size() > kMaxRegionIo) {
    *failed = -1;
    return std::nullopt;
  }
  Emitter emitter(ops_, info, base, v, last, region.rows, region.cols);
  region.source = emitter.Emit(region, &region.row_buffer_bytes);
  if (region.row_buffer_bytes > kMaxStackRowBufferBytes) {
    *failed = -1;
    return std::nullopt;
  }
  for (const RegionIo& out : region.outputs) {
    region.split_rows &= out.access == Access::kFull || out.access == Access::kRow;
    region.split_cols &= out.access == Access::kFull || out.access == Access::kCol;
  }
  for (int32_t u = v; u <= last; ++u) {
    region.split_cols &= !(ops_[u].kind == OpKind::kReduce && I(u).kind == Info::kComputed);
  }
  return region;
}

std::string Emitter::OpExpr(int32_t v, const std::vector<std::string>& a) {
  const Op& op = O(v);
  const std::string T = CType(op.type.dtype);
  const std::string In = CType(O(op.operands[0]).type.dtype);
  auto call = [&](const char* f) {
    return absl::StrCat(f, "<", T, ">(", a[0], a.size() > 1 ? ", " + a[1] : "", ")");
  };
  auto cmp = [&](const char* o) { return absl::StrCat("(", a[0], " ", o, " ", a[1], ")"); };
  const bool is_bool = op.type.dtype == DType::kBool;
  switch (op.kind) {
    case OpKind::kAdd: return call("ScalarAdd");
    case OpKind::kSub: return call("ScalarSub");
    case OpKind::kMul: return call("ScalarMul");
    case OpKind::kDiv: return call("ScalarDiv");
    case OpKind::kPow: return call("ScalarPow");
    case OpKind::kRem: return call("ScalarRem");
    case OpKind::kAtan2: return call("ScalarAtan2");
    case OpKind::kMax: return call("Max");
    case OpKind::kMin: return call("Min");
    case OpKind::kShiftLeft: return call("ShiftLeft");
    case OpKind::kShiftRightLogical: return call("ShiftRightLogical");
    case OpKind::kShiftRightArithmetic: return call("ShiftRightArithmetic");
    case OpKind::kNeg: return call("ScalarNeg");
    case OpKind::kAbs: return call("ScalarAbs");
    case OpKind::kEq: return cmp("==");
    case OpKind::kNe: return cmp("!=");
    case OpKind::kLt: return cmp("<");
    case OpKind::kLe: return cmp("<=");
    case OpKind::kGt: return cmp(">");
    case OpKind::kGe: return cmp(">=");
    case OpKind::kAnd:
      return is_bool ? cmp("&&") : absl::StrCat(T, "(", a[0], " & ", a[1], ")");
    case OpKind::kOr:
      return is_bool ? cmp("||") : absl::StrCat(T, "(", a[0], " | ", a[1], ")");
    case OpKind::kXor:
      return is_bool ? cmp("!=") : absl::StrCat(T, "(", a[0], " ^ ", a[1], ")");
    case OpKind::kNot:
      return is_bool ? absl::StrCat("(!", a[0], ")") : absl::StrCat(T, "(~", a[0], ")");
    case OpKind::kSelect:
      return absl::StrCat("(", a[0], " ? ", a[1], " : ", a[2], ")");
    case OpKind::kConvert:
      return absl::StrCat("ConvertScalar<", T, ", ", In, ">(", a[0], ")");
    default:
      break;
  }
  if (const char* f = LibmName(op.kind)) {
    return absl::StrCat("static_cast<", T, ">(std::", f, "(double(", a[0], ")))");
  }
  return "0";  // vector math: emitted as calls, not expressions
}

std::string Emitter::RowExpr(int32_t v) {
  v = Resolve(v);
  const Info& e = I(v);
  if (e.literal) return Literal(O(e.mem));
  if (e.kind == Info::kExternal) {
    return absl::StrCat("x", e.io, e.access == Access::kScalar ? "[0]" : "[r]");
  }
  return absl::StrCat("v", v);
}

std::string Emitter::ColumnExpr(int32_t v, int pass) {
  v = Resolve(v);
  Info& e = I(v);
  if (e.literal) return Literal(O(e.mem));
  if (e.kind == Info::kExternal) {
    switch (e.access) {
      case Access::kFull: return absl::StrCat("x", e.io, "[rowbase + c0 + i]");
      case Access::kCol: return absl::StrCat("x", e.io, "[c0 + i]");
      case Access::kRow: return absl::StrCat("x", e.io, "[r]");
      case Access::kScalar: return absl::StrCat("x", e.io, "[0]");
    }
  }
  if (!e.column) return absl::StrCat("v", v);
  if (e.buffer >= 0) return absl::StrCat("b", v, "[c0 + i]");
  if (e.pass != pass) return "0";  // never: a later pass reads it from its buffer
  if (e.inline_expr) {
    const Op& op = O(v);
    std::vector<std::string> a;
    for (int32_t w : op.operands) a.push_back(ColumnExpr(w, pass));
    return OpExpr(v, a);
  }
  return absl::StrCat("t", v, "[i]");
}

std::string Emitter::ColumnArray(int32_t v, int pass) {
  v = Resolve(v);
  const Info& e = I(v);
  if (e.literal) return "";
  if (e.kind == Info::kExternal) {
    return e.access == Access::kFull ? absl::StrCat("(x", e.io, " + rowbase + c0)") : "";
  }
  if (!e.column) return "";
  if (e.buffer >= 0) return absl::StrCat("(b", v, " + c0)");
  if (e.pass == pass && !e.inline_expr) return absl::StrCat("t", v);
  return "";
}

std::string Emitter::Emit(const FusedRegion& region, int64_t* row_buffer_bytes) {
  // Levels and passes, in op order.
  int num_passes = 1;
  int max_ready = 0;
  for (int32_t v = first_; v <= last_; ++v) {
    Info& e = I(v);
    if (e.kind != Info::kComputed && e.kind != Info::kAlias) continue;
    e.column = e.access == Access::kFull || e.access == Access::kCol;
    const Op& op = O(v);
    int pass = 0;
    for (int32_t w : op.operands) {
      const Info& f = I(w);
      if (f.kind == Info::kComputed || f.kind == Info::kAlias) pass = std::max(pass, f.pass);
    }
    if (op.kind == OpKind::kReduce) {
      e.reduce_pass = pass;
      e.pass = pass + 1;
      num_passes = std::max(num_passes, pass + 1);
      max_ready = std::max(max_ready, e.pass);
    } else {
      e.pass = pass;
      if (e.column) {
        num_passes = std::max(num_passes, pass + 1);
      } else {
        max_ready = std::max(max_ready, pass);
      }
    }
    for (int32_t w : op.operands) {
      const int32_t t = Resolve(w);
      Info& f = I(t);
      if (f.kind != Info::kComputed) continue;
      ++f.uses;
      // A column value read in a later pass, or reduced, is kept per row.
      const bool later = f.column && ((op.kind == OpKind::kReduce) || e.pass > f.pass);
      if (later && f.buffer < 0) f.buffer = 0;
      if (VectorMathName(op.kind) != nullptr || op.kind == OpKind::kReduce) f.uses += 2;
    }
  }
  int64_t buffer_bytes = 0;
  for (int32_t v = first_; v <= last_; ++v) {
    Info& e = I(v);
    if (e.kind != Info::kComputed) continue;
    if (e.buffer >= 0) {
      e.buffer = buffer_bytes;
      buffer_bytes += (cols_ * DTypeSize(O(v).type.dtype) + 63) / 64 * 64;
    }
    e.inline_expr = e.column && e.buffer < 0 && e.io < 0 && e.uses == 1 &&
                    VectorMathName(O(v).kind) == nullptr && O(v).kind != OpKind::kReduce;
  }
  *row_buffer_bytes = buffer_bytes;

  std::string s;
  absl::StrAppend(&s, "  // ops ", first_, "..", last_, ": ", rows_, " rows x ", cols_,
                  " columns a shard\n");
  absl::StrAppend(&s, "  constexpr int64_t R = ", rows_, ", C = ", cols_, ";\n");
  absl::StrAppend(&s, "  const PwVectorMath* vm = a->vm;\n");
  absl::StrAppend(&s, "  (void)vm;\n");
  if (buffer_bytes > 0) absl::StrAppend(&s, "  alignas(64) char rowbuf[", buffer_bytes, "];\n");
  absl::StrAppend(&s, "  for (int64_t u = a->row_begin; u < a->row_end; ++u) {\n");
  absl::StrAppend(&s, "    const int64_t s = u / R, r = u % R;\n    (void)r;\n");
  for (size_t k = 0; k < region.inputs.size(); ++k) {
    const char* T = CType(region.inputs[k].dtype);
    absl::StrAppend(&s, "    const ", T, "* const x", k, " = static_cast<const ", T, "*>(a->in[",
                    k, "]) + s * a->in_stride[", k, "];\n");
  }
  for (size_t k = 0; k < region.outputs.size(); ++k) {
    const char* T = CType(region.outputs[k].dtype);
    absl::StrAppend(&s, "    ", T, "* const o", k, " = static_cast<", T, "*>(a->out[", k,
                    "]) + s * a->out_stride[", k, "];\n");
  }
  for (int32_t v = first_; v <= last_; ++v) {
    const Info& e = I(v);
    if (e.kind == Info::kComputed && e.buffer >= 0) {
      const char* T = CType(O(v).type.dtype);
      absl::StrAppend(&s, "    ", T, "* const b", v, " = reinterpret_cast<", T,
                      "*>(rowbuf + ", e.buffer, ");\n");
    }
  }
  absl::StrAppend(&s, "    {\n");
  absl::StrAppend(&s, "      const int64_t rowbase = r * C;\n      (void)rowbase;\n");
  auto write_output = [&](std::string* out, int32_t v, const std::string& value,
                          const char* indent) {
    const Info& e = I(v);
    if (e.io < 0) return;
    const char* index = e.access == Access::kFull    ? "rowbase + c0 + i"
                        : e.access == Access::kCol   ? "c0 + i"
                        : e.access == Access::kRow   ? "r"
                                                     : "0";
    absl::StrAppend(out, indent, "o", e.io, "[", index, "] = ", value, ";\n");
  };
  const int last_step = std::max(num_passes, max_ready + 1);
  for (int t = 0; t < last_step; ++t) {
    // Row values ready at this pass.
    for (int32_t v = first_; v <= last_; ++v) {
      Info& e = I(v);
      if ((e.kind != Info::kComputed && e.kind != Info::kAlias) || e.column || e.pass != t ||
          O(v).kind == OpKind::kReduce) {
        continue;
      }
      const Op& op = O(v);
      if (e.kind == Info::kAlias) {
        write_output(&s, v, RowExpr(v), "      ");
        continue;
      }
      const char* T = CType(op.type.dtype);
      std::vector<std::string> a;
      for (int32_t w : op.operands) a.push_back(RowExpr(w));
      if (const char* f = VectorMathName(op.kind)) {
        absl::StrAppend(&s, "      ", T, " v", v, ";\n      { const ", T, " arg = ", a[0],
                        "; vm->", f, "_", DTypeSuffix(op.type.dtype), "(&arg, &v", v,
                        ", 1); }\n");
      } else {
        absl::StrAppend(&s, "      const ", T, " v", v, " = ", OpExpr(v, a), ";\n");
      }
      write_output(&s, v, absl::StrCat("v", v), "      ");
    }
    if (t < num_passes) {
      // The column loop of pass t.
      std::string body;
      bool any = false;
      for (int32_t v = first_; v <= last_; ++v) {
        Info& e = I(v);
        if ((e.kind != Info::kComputed && e.kind != Info::kAlias) || !e.column || e.pass != t) {
          continue;
        }
        const Op& op = O(v);
        const char* T = CType(op.type.dtype);
        if (e.kind == Info::kAlias) {
          if (e.io >= 0) {
            any = true;
            absl::StrAppend(&body, "        for (int64_t i = 0; i < len; ++i) ");
            write_output(&body, v, ColumnExpr(v, t), "");
          }
          continue;
        }
        if (e.inline_expr) continue;
        any = true;
        const std::string dest =
            e.buffer >= 0 ? absl::StrCat("(b", v, " + c0)") : absl::StrCat("t", v);
        if (e.buffer < 0) absl::StrAppend(&body, "        alignas(64) ", T, " t", v, "[", kChunk, "];\n");
        if (const char* f = VectorMathName(op.kind)) {
          std::string src = ColumnArray(op.operands[0], t);
          if (src.empty()) {
            absl::StrAppend(&body, "        alignas(64) ", T, " arg", v, "[", kChunk,
                            "];\n        for (int64_t i = 0; i < len; ++i) arg", v, "[i] = ",
                            ColumnExpr(op.operands[0], t), ";\n");
            src = absl::StrCat("arg", v);
          }
          absl::StrAppend(&body, "        vm->", f, "_", DTypeSuffix(op.type.dtype), "(", src,
                          ", ", dest, ", len);\n");
          if (e.io >= 0) {
            absl::StrAppend(&body, "        for (int64_t i = 0; i < len; ++i) ");
            write_output(&body, v, absl::StrCat(dest, "[i]"), "");
          }
          continue;
        }
        std::vector<std::string> a;
        for (int32_t w : op.operands) a.push_back(ColumnExpr(w, t));
        absl::StrAppend(&body, "        for (int64_t i = 0; i < len; ++i) {\n          const ", T,
                        " e = ", OpExpr(v, a), ";\n          ", dest, "[i] = e;\n");
        write_output(&body, v, "e", "          ");
        absl::StrAppend(&body, "        }\n");
      }
      if (any) {
        absl::StrAppend(&s, "      for (int64_t c0 = a->col_begin; c0 < a->col_end; c0 += ", kChunk,
                        ") {\n", "        const int64_t len = a->col_end - c0 < ", kChunk,
                        " ? a->col_end - c0 : ", kChunk, ";\n", body, "      }\n");
      }
      // The reductions of pass t, each over its row.
      for (int32_t v = first_; v <= last_; ++v) {
        Info& e = I(v);
        const Op& op = O(v);
        if (op.kind != OpKind::kReduce || e.kind != Info::kComputed || e.reduce_pass != t) continue;
        const char* T = CType(op.type.dtype);
        const int32_t w = Resolve(op.operands[0]);
        std::string src;
        const Info& f = I(w);
        if (f.kind == Info::kExternal) {
          src = absl::StrCat("(x", f.io, " + rowbase)");
        } else {
          src = absl::StrCat("b", w);
        }
        std::string value;
        switch (op.reduce_kind) {
          case ReduceKind::kSum: value = absl::StrCat("PairwiseSum(", src, ", C)"); break;
          case ReduceKind::kMean:
            value = absl::StrCat("PairwiseSum(", src, ", C) / static_cast<", T, ">(C)");
            break;
          case ReduceKind::kMax: value = absl::StrCat("RunMax(", src, ", C, true)"); break;
          default: value = absl::StrCat("RunMax(", src, ", C, false)"); break;
        }
        absl::StrAppend(&s, "      const ", T, " v", v, " = ", value, ";\n");
        write_output(&s, v, absl::StrCat("v", v), "      ");
      }
    }
  }
  absl::StrAppend(&s, "    }\n  }\n");
  return s;
}

}  // namespace

std::vector<FusedRegion> PlanFusedRegions(const FunctionIr& ir,
                                          absl::Span<const std::pair<int32_t, int32_t>> groups) {
  return Planner(ir, groups).Plan();
}

std::string EmitNativeSource(absl::Span<const FusedRegion> regions) {
  std::string s = NativePrelude();
  absl::StrAppend(&s, "\n#include <bit>\n\nusing namespace pw::kernels;\nusing namespace pw::codegen;\n\n");
  absl::StrAppend(&s, "extern \"C\" int pw_native_abi() { return kNativeAbiVersion; }\n\n");
  for (size_t k = 0; k < regions.size(); ++k) {
    absl::StrAppend(&s, "extern \"C\" void pw_region_", k, "(const PwNativeArgs* a) {\n",
                    regions[k].source, "}\n\n");
  }
  return s;
}

}  // namespace pw::codegen
