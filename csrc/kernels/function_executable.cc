#include "csrc/kernels/function_executable.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pw {
namespace {

constexpr int64_t kAlignment = 64;

int64_t RoundUp(int64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// Where the elements of one value live for the whole gang: element j of shard
// s is data[s * shard_stride + j * elem_stride] (strides in elements).
// Parameters and scratch values have shard_stride = num_elements; constants
// are shared by all shards (shard_stride 0); scalars have elem_stride 0 so
// they broadcast against a full operand.
struct View {
  const void* data;
  int64_t shard_stride;
  int64_t elem_stride;
};

// 1 if the view's elements for a result of n elements per shard sit at flat
// index i (one loop over the gang), 0 if they are all the same element, -1 if
// neither.
int FlatStride(const View& v, int64_t n) {
  if (v.shard_stride == n && (v.elem_stride == 1 || n == 1)) return 1;
  if (v.shard_stride == 0 && v.elem_stride == 0) return 0;
  return -1;
}

template <typename In, typename Out, typename F>
void Map1(int num_shards, int64_t n, View x, Out* out, F f) {
  const In* px = static_cast<const In*>(x.data);
  const int64_t total = num_shards * n;
  switch (FlatStride(x, n)) {
    case 1:
      for (int64_t i = 0; i < total; ++i) out[i] = f(px[i]);
      return;
    case 0:
      std::fill(out, out + total, f(px[0]));
      return;
    default:
      for (int s = 0; s < num_shards; ++s) {
        const In* rx = px + s * x.shard_stride;
        Out* ro = out + s * n;
        for (int64_t j = 0; j < n; ++j) ro[j] = f(rx[j * x.elem_stride]);
      }
  }
}

template <typename T, typename F>
void Map2(int num_shards, int64_t n, View a, View b, T* out, F f) {
  const T* pa = static_cast<const T*>(a.data);
  const T* pb = static_cast<const T*>(b.data);
  const int64_t total = num_shards * n;
  const int fa = FlatStride(a, n);
  const int fb = FlatStride(b, n);
  if (fa == 1 && fb == 1) {
    for (int64_t i = 0; i < total; ++i) out[i] = f(pa[i], pb[i]);
    return;
  }
  if (fa == 1 && fb == 0) {
    const T y = pb[0];
    for (int64_t i = 0; i < total; ++i) out[i] = f(pa[i], y);
    return;
  }
  if (fa == 0 && fb == 1) {
    const T x = pa[0];
    for (int64_t i = 0; i < total; ++i) out[i] = f(x, pb[i]);
    return;
  }
  // A per-shard scalar against a full operand, or a non-scalar constant:
  // shards outside, elements inside.
  for (int s = 0; s < num_shards; ++s) {
    const T* ra = pa + s * a.shard_stride;
    const T* rb = pb + s * b.shard_stride;
    T* ro = out + s * n;
    if (a.elem_stride != 0 && b.elem_stride != 0) {
      for (int64_t j = 0; j < n; ++j) ro[j] = f(ra[j], rb[j]);
    } else if (a.elem_stride != 0) {
      const T y = rb[0];
      for (int64_t j = 0; j < n; ++j) ro[j] = f(ra[j], y);
    } else if (b.elem_stride != 0) {
      const T x = ra[0];
      for (int64_t j = 0; j < n; ++j) ro[j] = f(x, rb[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) ro[j] = f(ra[0], rb[0]);
    }
  }
}

// Sums shards in order 0..num_shards-1 into shard 0 of `out` (row by row, so
// the reads stay sequential), then replicates shard 0 to the other shards.
template <typename T>
void Psum(int num_shards, int64_t n, View x, T* out) {
  const T* px = static_cast<const T*>(x.data);
  for (int64_t j = 0; j < n; ++j) out[j] = px[j * x.elem_stride];
  for (int s = 1; s < num_shards; ++s) {
    const T* rx = px + s * x.shard_stride;
    for (int64_t j = 0; j < n; ++j) out[j] += rx[j * x.elem_stride];
  }
  if (n == 1) {  // a scalar all-reduce: one fill, not a memcpy call per shard
    std::fill(out + 1, out + num_shards, out[0]);
    return;
  }
  for (int s = 1; s < num_shards; ++s) {
    if (n > 0) std::memcpy(out + s * n, out, n * sizeof(T));
  }
}

template <typename T>
void RunBinary(OpKind kind, int num_shards, int64_t n, View a, View b, void* out) {
  T* o = static_cast<T*>(out);
  switch (kind) {
    case OpKind::kAdd:
      return Map2(num_shards, n, a, b, o, [](T x, T y) { return x + y; });
    case OpKind::kSub:
      return Map2(num_shards, n, a, b, o, [](T x, T y) { return x - y; });
    case OpKind::kMul:
      return Map2(num_shards, n, a, b, o, [](T x, T y) { return x * y; });
    case OpKind::kDiv:
      return Map2(num_shards, n, a, b, o, [](T x, T y) { return x / y; });
    default:
      return;
  }
}

template <typename In>
void RunConvert(DType to, int num_shards, int64_t n, View x, void* out) {
  if (to == DType::kF64) {
    Map1<In>(num_shards, n, x, static_cast<double*>(out),
             [](In v) { return static_cast<double>(v); });
  } else {
    Map1<In>(num_shards, n, x, static_cast<float*>(out),
             [](In v) { return static_cast<float>(v); });
  }
}

// Calls f with a null pointer of the element type of `dtype`.
template <typename F>
void DispatchDType(DType dtype, F&& f) {
  if (dtype == DType::kF64) {
    f(static_cast<double*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const FunctionExecutable>> FunctionExecutable::Compile(
    std::shared_ptr<const FunctionIr> ir) {
  if (ir == nullptr) return absl::InvalidArgumentError("compile: null function");
  const absl::Span<const Op> ops = ir->ops();
  const int32_t num_ops = static_cast<int32_t>(ops.size());

  // Last op that reads each value; outputs stay live past the last op.
  std::vector<int32_t> last_use(num_ops);
  for (int32_t i = 0; i < num_ops; ++i) {
    last_use[i] = i;
    switch (ops[i].kind) {
      case OpKind::kParameter:
      case OpKind::kConstant:
      case OpKind::kConvert:
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul:
      case OpKind::kDiv:
      case OpKind::kNeg:
      case OpKind::kPsum:
      case OpKind::kSimulatedCompute:
        break;
      default:
        return absl::UnimplementedError(
            absl::StrCat("compile: @", ir->name(), ": op %", i, " has kind ",
                         static_cast<int>(ops[i].kind), ", which the kernels cannot run"));
    }
    for (int32_t v : ops[i].operands) last_use[v] = i;
  }
  for (int32_t v : ir->outputs()) last_use[v] = num_ops;

  // Parameters are read in place and constants straight from their literal;
  // every other value gets a scratch slot. First fit over the slots of values
  // still live at its definition, so dead intermediates are reused. A value
  // never shares a slot with its operands (they are live at its definition).
  auto exe = std::shared_ptr<FunctionExecutable>(new FunctionExecutable(ir));
  exe->scratch_offset_.assign(num_ops, -1);
  struct Slot {
    int64_t offset;
    int64_t size;
  };
  std::vector<Slot> live;
  for (int32_t v = 0; v < num_ops; ++v) {
    const OpKind kind = ops[v].kind;
    if (kind == OpKind::kParameter || kind == OpKind::kConstant) continue;
    const int64_t size = RoundUp(ops[v].type.num_bytes());
    live.clear();
    for (int32_t u = 0; u < v; ++u) {
      if (exe->scratch_offset_[u] >= 0 && last_use[u] >= v) {
        live.push_back({exe->scratch_offset_[u], RoundUp(ops[u].type.num_bytes())});
      }
    }
    std::sort(live.begin(), live.end(),
              [](const Slot& a, const Slot& b) { return a.offset < b.offset; });
    int64_t offset = 0;
    for (const Slot& s : live) {
      if (offset + size <= s.offset) break;
      offset = std::max(offset, s.offset + s.size);
    }
    exe->scratch_offset_[v] = offset;
    exe->scratch_per_shard_ = std::max(exe->scratch_per_shard_, offset + size);
  }
  return std::shared_ptr<const FunctionExecutable>(std::move(exe));
}

void FunctionExecutable::Run(int num_shards, absl::Span<const void* const> inputs,
                             absl::Span<void* const> outputs, void* scratch) const {
  const absl::Span<const Op> ops = ir_->ops();
  uint8_t* const base = static_cast<uint8_t*>(scratch);

  auto view = [&](int32_t v) -> View {
    const Op& op = ops[v];
    const int64_t n = op.type.num_elements();
    const int64_t elem_stride = op.type.dims.empty() ? 0 : 1;
    switch (op.kind) {
      case OpKind::kParameter:
        return {inputs[op.param_index], n, elem_stride};
      case OpKind::kConstant:
        return {op.literal.data(), 0, elem_stride};
      default:
        return {base + scratch_offset_[v] * num_shards, n, elem_stride};
    }
  };

  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::kParameter || op.kind == OpKind::kConstant) continue;
    void* out = base + scratch_offset_[i] * num_shards;
    const int64_t n = op.type.num_elements();
    const View x = view(op.operands[0]);
    switch (op.kind) {
      case OpKind::kConvert:
        DispatchDType(ops[op.operands[0]].type.dtype, [&](auto* tag) {
          using In = std::remove_pointer_t<decltype(tag)>;
          RunConvert<In>(op.type.dtype, num_shards, n, x, out);
        });
        break;
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul:
      case OpKind::kDiv: {
        const View y = view(op.operands[1]);
        DispatchDType(op.type.dtype, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          RunBinary<T>(op.kind, num_shards, n, x, y, out);
        });
        break;
      }
      case OpKind::kNeg:
        DispatchDType(op.type.dtype, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          Map1<T>(num_shards, n, x, static_cast<T*>(out), [](T v) { return -v; });
        });
        break;
      case OpKind::kPsum:
        DispatchDType(op.type.dtype, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          Psum<T>(num_shards, n, x, static_cast<T*>(out));
        });
        break;
      case OpKind::kSimulatedCompute:  // the time is spent by the executor, not here
        DispatchDType(op.type.dtype, [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          Map1<T>(num_shards, n, x, static_cast<T*>(out), [](T v) { return v; });
        });
        break;
      default:
        break;  // rejected by Compile
    }
  }

  for (int i = 0; i < ir_->num_outputs(); ++i) {
    const int32_t v = ir_->outputs()[i];
    const View src = view(v);
    const int64_t bytes = ops[v].type.num_bytes();
    if (bytes == 0) continue;
    uint8_t* dst = static_cast<uint8_t*>(outputs[i]);
    if (src.shard_stride != 0) {
      std::memcpy(dst, src.data, bytes * num_shards);
    } else {  // a constant: every shard gets the literal
      for (int s = 0; s < num_shards; ++s) std::memcpy(dst + s * bytes, src.data, bytes);
    }
  }
}

}  // namespace pw
