#ifndef PATHWAYS_BASE_BFLOAT16_H_
#define PATHWAYS_BASE_BFLOAT16_H_

// bfloat16: the upper half of a float32 (sign, 8 exponent bits, 7 mantissa
// bits). It is a storage type only: the function IR computes on bfloat16
// values in float32 and rounds each result back (function_ir.h), so the
// kernels need nothing but the conversions here. BFloat16 deliberately has
// no arithmetic, so a kernel that would compute on it does not compile.
//
// The conversions give the bits of ml_dtypes.bfloat16 (numpy's and JAX's
// bfloat16) and of XLA's convert: float32 -> bfloat16 rounds to nearest,
// ties to even; NaN becomes the quiet NaN 0x7fc0 with the input's sign (no
// rounding carry may turn a NaN into an infinity); float64 and the integer
// types go through float32 first, as ml_dtypes does. bfloat16 -> float32 is
// exact.

#include <bit>
#include <cstdint>

namespace pw {

struct BFloat16 {
  uint16_t bits = 0;  // zero bits are +0.0, so value-initialized storage reads as zeros

  friend constexpr bool operator==(BFloat16 a, BFloat16 b) = default;  // bitwise
};
static_assert(sizeof(BFloat16) == 2);

// The bfloat16 nearest `f` (ties to even); NaN keeps its sign only.
constexpr BFloat16 FloatToBFloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: rounding could carry it into inf
    return BFloat16{static_cast<uint16_t>((u >> 16 & 0x8000u) | 0x7fc0u)};
  }
  // Adding just under half a unit of the kept part, plus its lowest bit,
  // rounds half to even; a carry out of the mantissa steps the exponent,
  // which is the right answer (up to infinity).
  const uint32_t rounded = u + 0x7fffu + (u >> 16 & 1u);
  return BFloat16{static_cast<uint16_t>(rounded >> 16)};
}

constexpr float BFloat16ToFloat(BFloat16 b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16);
}

}  // namespace pw

#endif  // PATHWAYS_BASE_BFLOAT16_H_
