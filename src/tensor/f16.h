// IEEE half <-> float on the host: exact widening, round-to-nearest-even narrowing with
// subnormals, infinities and NaN kept.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tandem {

inline float f16_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline uint16_t float_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00;
  if (magnitude >= 65520.0f) return sign | 0x7c00;  // rounds past the largest half, 65504
  if (magnitude < 0x1p-14f)                          // subnormal: a multiple of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 0x1p24f));
  const uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15, mantissa = bits & 0x7fffff;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // a carry moves into the exponent, as it should
  return sign | static_cast<uint16_t>(half);
}

}  // namespace tandem
