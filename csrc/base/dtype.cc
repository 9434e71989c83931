#include "csrc/base/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pw {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
  }
  return "unknown";
}

absl::string_view DTypeShortName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  if (name == "float32") return DType::kF32;
  if (name == "float64") return DType::kF64;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", name, " is not supported; supported dtypes: float32, float64"));
}

DType PromoteTypes(DType a, DType b) {
  return (a == DType::kF64 || b == DType::kF64) ? DType::kF64 : DType::kF32;
}

int64_t NumElements(absl::Span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string DimsToString(absl::Span<const int64_t> dims) {
  if (dims.size() == 1) return absl::StrCat("(", dims[0], ",)");
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

std::string TypeToString(DType dtype, absl::Span<const int64_t> dims) {
  return absl::StrCat(DTypeShortName(dtype), "[", absl::StrJoin(dims, ","), "]");
}

}  // namespace pw
