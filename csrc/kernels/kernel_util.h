#ifndef PATHWAYS_KERNELS_KERNEL_UTIL_H_
#define PATHWAYS_KERNELS_KERNEL_UTIL_H_

// What the kernels of a compiled function share: how a value of the whole
// gang is addressed (View), dtype dispatch, and numpy's integer and NaN
// semantics. Internal to csrc/kernels.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "csrc/base/bfloat16.h"
#include "csrc/base/dtype.h"
#include "csrc/function_ir/function_ir.h"
#include "csrc/kernels/scalar_ops.h"

namespace pw::kernels {

inline constexpr int64_t kAlignment = 64;

inline int64_t RoundUp(int64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

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
inline int FlatStride(const View& v, int64_t n) {
  if (v.shard_stride == n && (v.elem_stride == 1 || n == 1)) return 1;
  if (v.shard_stride == 0 && v.elem_stride == 0) return 0;
  return -1;
}

// The offset of row-major element `i` of `dims` in a layout of `strides`.
inline int64_t Offset(int64_t i, const Dims& dims, const Dims& strides) {
  int64_t off = 0;
  for (size_t d = dims.size(); d-- > 0;) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

// A constant's bytes. An empty constant's vector has no storage (data() may
// be null); kernels offset pointers even when they read nothing, so it gets a
// real address.
inline const void* LiteralData(const Op& op) {
  static constexpr uint64_t kNoElements[1] = {0};
  return op.literal.empty() ? static_cast<const void*>(kNoElements) : op.literal.data();
}

// Calls f with a null pointer of the element type of `dtype`, for kernels
// that compute. bfloat16 never reaches them (the builder computes it in
// float32, and Compile checks; function_ir.h), so for it f is not called.
template <typename F>
void DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF64:
      return f(static_cast<double*>(nullptr));
    case DType::kI32:
      return f(static_cast<int32_t*>(nullptr));
    case DType::kU32:
      return f(static_cast<uint32_t*>(nullptr));
    case DType::kBool:
      return f(static_cast<bool*>(nullptr));
    case DType::kF32:
      return f(static_cast<float*>(nullptr));
    case DType::kBF16:
      return;
  }
}

// DispatchDType for kernels that only move or convert elements: bfloat16
// too, as BFloat16 (which has no arithmetic).
template <typename F>
void DispatchStorageDType(DType dtype, F&& f) {
  if (dtype == DType::kBF16) return f(static_cast<BFloat16*>(nullptr));
  DispatchDType(dtype, f);
}

// Whether the kernels take an op of `kind` on bfloat16 values: those that
// move elements without computing on them, and convert.
inline bool MovesBFloat16(OpKind kind) {
  switch (GetOpClass(kind)) {
    case OpClass::kSource:
    case OpClass::kSimulated:
    case OpClass::kDataMovement:
    // A loop copies its carries, slices and ys by bytes; its body is
    // compiled (and checked) as a function of its own.
    case OpClass::kControl:
      return true;
    default:
      return kind == OpKind::kConvert || kind == OpKind::kSelect || kind == OpKind::kTake ||
             kind == OpKind::kAllGather || kind == OpKind::kPpermute ||
             kind == OpKind::kAllToAll;
  }
}

// Product of dims [begin, end).
inline int64_t DimProduct(const Dims& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end; ++d) p *= dims[d];
  return p;
}

}  // namespace pw::kernels

#endif  // PATHWAYS_KERNELS_KERNEL_UTIL_H_
