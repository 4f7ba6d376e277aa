// IEEE binary16 (half) <-> float on the host, round-to-nearest-even as the GPU's
// __float2half; values past the largest half (65504) become infinity, NaN stays NaN.
#pragma once
#include <cstdint>
#include <cstring>

namespace tandem {

inline uint16_t float_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  if (bits >= 0x47800000u)  // |value| >= 2^16, infinity or NaN: no rounding can bring it back
    return static_cast<uint16_t>(sign | (bits > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (bits < 0x38800000u) {  // below 2^-14: a subnormal half or zero
    // Adding 0.5 puts the half's subnormal step (2^-24) at the float's last mantissa bit,
    // so the FPU's own round-to-nearest-even does the rounding.
    float magnitude;
    std::memcpy(&magnitude, &bits, 4);
    magnitude += 0.5f;
    std::memcpy(&bits, &magnitude, 4);
    return static_cast<uint16_t>(sign | (bits - 0x3f000000u));
  }
  const uint32_t odd = (bits >> 13) & 1u;
  bits += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round half to even
  return static_cast<uint16_t>(sign | (bits >> 13));  // a carry past 65504 lands on 0x7c00
}

inline float f16_to_float(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  const uint32_t mantissa = value & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // subnormal or zero: exact
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
  }
  float result;
  std::memcpy(&result, &bits, 4);
  return result;
}

}  // namespace tandem
