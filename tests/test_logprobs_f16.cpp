// IEEE half conversions (tensor/f16.h), which the F16 log-prob path reads and writes through.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tensor/f16.h"

namespace tandem {
namespace {

TEST(F16Conversion, EveryHalfSurvivesARoundTrip) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    const float value = f16_to_float(half);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(value))));
      continue;
    }
    ASSERT_EQ(float_to_f16(value), half) << std::hex << bits;
  }
}

TEST(F16Conversion, KnownValues) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
}

TEST(F16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie: to the even 1.0
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to the even 1 + 2^-9
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.2f, -11)), 0x3c01);      // past the tie
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // the tie above the largest half goes to infinity
  EXPECT_EQ(float_to_f16(1e9f), 0x7c00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormal halves: steps of 2^-24.
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie: to the even 0
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);      // tie: to the even 2
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_f16(std::ldexp(1023.5f, -24)), 0x0400);   // rounds up into the normals
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
}

TEST(F16Conversion, RandomFloatsGoToTheNearestHalf) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> exponent(-26, 16.5f), sign(-1, 1);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::copysign(std::exp2(exponent(rng)), sign(rng));
    const uint16_t h = float_to_f16(x);
    const float y = f16_to_float(h);
    if (std::isinf(y)) {
      ASSERT_GE(std::fabs(x), 65520.0f) << x;
      continue;
    }
    // No neighbouring half is nearer.
    for (const int step : {-1, 1}) {
      const auto neighbour = static_cast<uint16_t>(h + step);
      if ((neighbour & 0x7fff) >= 0x7c00 || (h & 0x7fff) == 0) continue;
      ASSERT_LE(std::fabs(static_cast<double>(y) - x), std::fabs(static_cast<double>(f16_to_float(neighbour)) - x))
          << x;
    }
  }
}

}  // namespace
}  // namespace tandem
