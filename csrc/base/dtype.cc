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
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  if (name == "float32") return DType::kF32;
  if (name == "float64") return DType::kF64;
  if (name == "int32") return DType::kI32;
  if (name == "bool") return DType::kBool;
  return UnsupportedTypeError(absl::StrCat(
      "dtype ", name, " is not supported; supported dtypes: float32, float64, int32, bool"));
}

namespace {
int PromotionRank(DType t) {
  switch (t) {
    case DType::kBool:
      return 0;
    case DType::kI32:
      return 1;
    case DType::kF32:
      return 2;
    case DType::kF64:
      return 3;
  }
  return 3;
}
}  // namespace

DType PromoteTypes(DType a, DType b) {
  if ((a == DType::kI32 && b == DType::kF32) || (a == DType::kF32 && b == DType::kI32)) {
    return DType::kF64;
  }
  return PromotionRank(a) >= PromotionRank(b) ? a : b;
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
