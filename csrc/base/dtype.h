#ifndef PATHWAYS_BASE_DTYPE_H_
#define PATHWAYS_BASE_DTYPE_H_

// Element types and shapes shared by every component: the function IR, the
// object store and the program IR all speak of arrays as (DType, Dims).

#include <cstdint>
#include <string>
#include <type_traits>
#include "absl/strings/string_view.h"

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pw {

enum class DType : uint8_t {
  kF32 = 0,
  kF64 = 1,
  kI32 = 2,
  kBool = 3,  // one byte per element, 0 or 1 (numpy's bool_)
  kU32 = 4,   // unsigned: arithmetic wraps modulo 2^32 (PRNG keys and bits)
};

// Size of one element in bytes.
int64_t DTypeSize(DType dtype);

// numpy's name for the type: "float32", "float64", "int32", "bool", "uint32".
absl::string_view DTypeName(DType dtype);

// The short name used in IR text: "f32", "f64", "i32", "pred", "u32".
absl::string_view DTypeShortName(DType dtype);

// The supported types' numpy names, for messages.
inline constexpr absl::string_view kSupportedDTypeNames = "float32, float64, int32, bool, uint32";

// Parses numpy's name ("float32", ...). InvalidArgument of kind kUnsupportedType
// (error_kind.h) names the supported types.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

// The type of `a op b` under numpy's promotion rules for the supported types:
// bool < {int32, uint32} < float32 < float64, except that an integer with
// float32 gives float64 (float32 cannot hold every int32 or uint32). Where
// numpy's answer is a type we lack, JAX's with x64 disabled: int32 with
// uint32 gives int32 (numpy: int64), so a uint32 above 2^31 - 1 wraps to a
// negative int32 there.
DType PromoteTypes(DType a, DType b);

// True for kF32 and kF64.
inline bool IsFloat(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF64; }

// True for kI32 and kU32.
inline bool IsInteger(DType dtype) { return dtype == DType::kI32 || dtype == DType::kU32; }

// Dimensions of an array; rank 0 is a scalar.
using Dims = absl::InlinedVector<int64_t, 6>;

// Product of the dimensions (1 for a scalar). The dimensions must be valid
// (see CheckedNumBytes); nothing is checked here.
int64_t NumElements(absl::Span<const int64_t> dims);

// The largest array (of one shard) the runtime represents: 1 TiB. Sizes up to
// it never overflow int64 arithmetic on offsets and byte counts; real limits
// (device memory) are checked where memory is taken.
inline constexpr int64_t kMaxArrayBytes = int64_t{1} << 40;

// Bytes of an array of `dtype` and `dims`, or InvalidArgument, naming `what`
// and the type, for a negative dimension or more than kMaxArrayBytes bytes
// (no overflow on the way). An empty array is held to the same bound with its
// zero dimensions counted as 1, so no stride of any array overflows.
absl::StatusOr<int64_t> CheckedNumBytes(absl::string_view what, DType dtype, absl::Span<const int64_t> dims);

// "(2, 3)" as numpy prints a shape.
std::string DimsToString(absl::Span<const int64_t> dims);

// "f32[2,3]" as the IR text prints an array type.
std::string TypeToString(DType dtype, absl::Span<const int64_t> dims);

// The DType of C++ element type T: float, double, int32_t, uint32_t, or
// bool/uint8_t (a bool element is one byte). Other types do not compile.
template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  else if constexpr (std::is_same_v<T, double>) return DType::kF64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  else if constexpr (std::is_same_v<T, uint32_t>) return DType::kU32;
  else {
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>, "no DType for this type");
    return DType::kBool;
  }
}

}  // namespace pw

#endif  // PATHWAYS_BASE_DTYPE_H_
