// The host's FP8 E4M3 codec (tensor/fp8.h) against the format's definition: every code
// decodes to its value and encodes back to itself, halfway values round to the even code,
// magnitudes past 448 saturate, and NaN stays NaN. tests/gpu_paged_attention.cpp checks
// the same rounding against the GPU's __nv_cvt_float_to_fp8 on random values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "tensor/fp8.h"

namespace tandem {
namespace {

TEST(E4m3, EveryCodeDecodesToItsValueAndEncodesBack) {
  for (int code = 0; code < 256; ++code) {
    const float value = e4m3_to_float(static_cast<uint8_t>(code));
    const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    const float magnitude = exponent == 0 ? mantissa * 0x1p-9f : std::ldexp(1 + mantissa / 8.f, exponent - 7);
    EXPECT_EQ(value, code & 0x80 ? -magnitude : magnitude) << code;
    EXPECT_EQ(float_to_e4m3(value), code) << code;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
}

TEST(E4m3, RoundsHalfwayToEvenAndSaturates) {
  // Between consecutive codes the midpoint goes to the even one, anything past it up.
  for (int code = 0; code < 0x7e; ++code) {
    const float low = e4m3_to_float(static_cast<uint8_t>(code)), high = e4m3_to_float(static_cast<uint8_t>(code + 1));
    const float middle = (low + high) / 2;
    EXPECT_EQ(float_to_e4m3(middle), code % 2 == 0 ? code : code + 1) << code;
    EXPECT_EQ(float_to_e4m3(std::nextafter(middle, 0.f)), code) << code;
    EXPECT_EQ(float_to_e4m3(std::nextafter(middle, 1e9f)), code + 1) << code;
    EXPECT_EQ(float_to_e4m3(-middle), 0x80 | (code % 2 == 0 ? code : code + 1)) << code;
  }
  EXPECT_EQ(float_to_e4m3(449.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_e4m3(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(float_to_e4m3(0x1p-11f), 0x00);  // below half the smallest step
  EXPECT_EQ(float_to_e4m3(-0.f), 0x80);
}

}  // namespace
}  // namespace tandem
