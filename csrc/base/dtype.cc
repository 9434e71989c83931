#include "csrc/base/dtype.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "csrc/base/error_kind.h"

namespace pw {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kI32:
      return "int32";
    case DType::kBool:
      return "bool";
    case DType::kU32:
      return "uint32";
  }
  return "unknown";
}

absl::string_view DTypeShortName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kBool:
      return "pred";
    case DType::kU32:
      return "u32";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  if (name == "float32") return DType::kF32;
  if (name == "float64") return DType::kF64;
  if (name == "int32") return DType::kI32;
  if (name == "bool") return DType::kBool;
  if (name == "uint32") return DType::kU32;
  return UnsupportedTypeError(absl::StrCat("dtype ", name, " is not supported; supported dtypes: ",
                                           kSupportedDTypeNames));
}

DType PromoteTypes(DType a, DType b) {
  if (a == b || b == DType::kBool) return a;
  if (a == DType::kBool) return b;
  if (IsInteger(a) && IsInteger(b)) return DType::kI32;  // int32 with uint32
  if (IsInteger(a)) return b == DType::kF32 ? DType::kF64 : b;
  if (IsInteger(b)) return a == DType::kF32 ? DType::kF64 : a;
  return DType::kF64;  // float32 with float64
}

int64_t NumElements(absl::Span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<int64_t> CheckedNumBytes(absl::string_view what, DType dtype, absl::Span<const int64_t> dims) {
  // The product skips zero dimensions, so that the strides of an empty array
  // (products of its other dimensions) are bounded too.
  int64_t bytes = DTypeSize(dtype);
  bool too_large = false, empty = false;
  for (int64_t d : dims) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": negative dimension in ", TypeToString(dtype, dims)));
    }
    empty = empty || d == 0;
    too_large = too_large || __builtin_mul_overflow(bytes, std::max<int64_t>(d, 1), &bytes) ||
                bytes > kMaxArrayBytes;
  }
  if (too_large) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", TypeToString(dtype, dims),
                                                   " is too large (over 2^40 bytes per shard)"));
  }
  return empty ? 0 : bytes;
}

std::string DimsToString(absl::Span<const int64_t> dims) {
  if (dims.size() == 1) return absl::StrCat("(", dims[0], ",)");
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

std::string TypeToString(DType dtype, absl::Span<const int64_t> dims) {
  return absl::StrCat(DTypeShortName(dtype), "[", absl::StrJoin(dims, ","), "]");
}

}  // namespace pw
