#include "csrc/base/bfloat16.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "gtest/gtest.h"

namespace pw {
namespace {

float FloatOfBits(uint32_t u) { return std::bit_cast<float>(u); }

// The reference: the bfloat16 nearest `f` by value, found by comparing the
// distances (exact in double) to the two bfloat16 values around it; ties go
// to the one with an even last bit. Infinity counts as 2^128 here, as IEEE
// rounding does (a value at or above the largest finite bfloat16 plus half
// an ulp rounds to infinity).
uint16_t NearestBFloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16 & 0x8000u) | 0x7fc0u);
  const uint16_t below = static_cast<uint16_t>(u >> 16);  // toward zero
  if ((u & 0xffffu) == 0) return below;
  const uint16_t above = static_cast<uint16_t>(below + 1);  // away from zero
  auto magnitude = [](uint16_t b) {
    if ((b & 0x7fffu) == 0x7f80u) return std::ldexp(1.0, 128);
    return std::abs(static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(b) << 16)));
  };
  const double x = std::abs(static_cast<double>(f));
  const double to_below = x - magnitude(below);
  const double to_above = magnitude(above) - x;
  if (to_below != to_above) return to_below < to_above ? below : above;
  return (below & 1u) == 0 ? below : above;
}

TEST(BFloat16Test, ConversionIsExactFromBFloat16) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float f = BFloat16ToFloat(BFloat16{static_cast<uint16_t>(b)});
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    const BFloat16 back = FloatToBFloat16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back.bits, (b & 0x8000u) | 0x7fc0u) << std::hex << b;  // quiet, sign kept
    } else {
      EXPECT_EQ(back.bits, b) << std::hex << b;
    }
  }
}

// Every bfloat16 neighbourhood: for each upper half, the lower halves that
// decide rounding (zero, just above and below a tie, the tie itself, the
// extremes) and a spread of others. PW_BFLOAT16_EXHAUSTIVE=1 visits all 2^32
// floats instead.
TEST(BFloat16Test, RoundsToNearestEvenLikeTheReference) {
  const bool exhaustive = std::getenv("PW_BFLOAT16_EXHAUSTIVE") != nullptr;
  const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000,
                           0x8001, 0x8002, 0xbfff, 0xc000, 0xfffe, 0xffff};
  int64_t mismatches = 0;
  auto check = [&](uint32_t u) {
    const float f = FloatOfBits(u);
    const uint16_t got = FloatToBFloat16(f).bits;
    const uint16_t want = NearestBFloat16(f);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "float bits 0x" << u << ": got 0x" << got << ", want 0x" << want;
    }
  };
  for (uint32_t hi = 0; hi <= 0xffffu; ++hi) {
    if (exhaustive) {
      for (uint32_t lo = 0; lo <= 0xffffu; ++lo) check(hi << 16 | lo);
      continue;
    }
    for (uint32_t lo : lows) check(hi << 16 | lo);
    for (uint32_t lo = (hi * 2654435761u) & 0x1fffu; lo <= 0xffffu; lo += 0x2000u) {
      check(hi << 16 | lo);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BFloat16Test, EdgeValues) {
  EXPECT_EQ(FloatToBFloat16(0.0f).bits, 0x0000);
  EXPECT_EQ(FloatToBFloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(FloatToBFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7, and goes to the
  // even 1; 1 + 3 * 2^-8 goes up to the even 1 + 2^-6.
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f).bits, 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3f81);  // past the tie
  // The largest float rounds to infinity; the largest finite bfloat16 stays.
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x7f7f0000u)).bits, 0x7f7f);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x7f7f7fffu)).bits, 0x7f7f);
  // Subnormals keep their spacing (no flush to zero); the smallest rounds
  // up from above its half.
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x00010000u)).bits, 0x0001);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x00008001u)).bits, 0x0001);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x00008000u)).bits, 0x0000);  // tie to even zero
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x80018000u)).bits, 0x8002);
  // NaNs of any payload become the quiet NaN of their sign, never infinity.
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x7f800001u)).bits, 0x7fc0);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x7fffffffu)).bits, 0x7fc0);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0xff80ffffu)).bits, 0xffc0);
  static_assert(FloatToBFloat16(2.0f).bits == 0x4000);  // usable at compile time
}

}  // namespace
}  // namespace pw
