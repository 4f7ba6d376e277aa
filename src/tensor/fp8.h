// FP8 E4M3 (OCP "fn": no infinities, one NaN code per sign, largest finite 448) <->
// float on the host, with the rounding of the GPU's __nv_cvt_float_to_fp8(x,
// __NV_SATFINITE, __NV_E4M3): nearest even, finite values beyond 448 clamped to 448.
#pragma once
#include <cmath>
#include <cstdint>

namespace tandem {

inline constexpr float kE4m3Max = 448.0f;

// A head's elements as codes of one scale (rollout/paged_attention.h): the factor into
// codes and the scale back out, from the head's largest magnitude. constexpr, so the
// kernels (kernels/e4m3.cuh) take the same definitions.
constexpr float e4m3_inverse_scale(float amax) { return amax > 0.f ? kE4m3Max / amax : 0.f; }
constexpr float e4m3_scale(float amax) { return amax / kE4m3Max; }

inline uint8_t float_to_e4m3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7f;
  if (a >= kE4m3Max) return sign | 0x7e;
  // Below 2^-6 the codes are subnormal, multiples of 2^-9; above, 8 steps per binade. In
  // both, the code grows by one per step, so a rounded step count is the code itself.
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  int exponent = 0;
  const float mantissa = std::frexp(a, &exponent);  // a = mantissa · 2^exponent, mantissa in [0.5, 1)
  const int steps = static_cast<int>(std::nearbyint((mantissa * 2 - 1) * 8));  // 8 carries into the next binade
  const int code = ((exponent - 1 + 7) << 3) + steps;
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

inline float e4m3_to_float(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  float magnitude;
  if ((code & 0x7f) == 0x7f) magnitude = NAN;
  else if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  else magnitude = std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

}  // namespace tandem
