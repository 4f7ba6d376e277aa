// FP8 E4M3 codes of the KV cache on the device: a head's elements as codes of one scale
// (rollout/paged_attention.h). Host twin: tensor/fp8.h, whose rounding matches
// __nv_cvt_float_to_fp8 with __NV_SATFINITE, and tests/gpu_paged_attention.cpp checks.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "tensor/fp8.h"  // e4m3_inverse_scale, e4m3_scale: the host's own, constexpr

namespace tandem::cuda {

__device__ inline uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// The N codes of y[0..N) · inverse (N = 1, 2, 4 or 8) as one store at p, aligned to N
// bytes: two conversions an instruction, where a byte store each took N stores.
template <int N>
__device__ inline void store_e4m3(uint8_t* p, const float* y, float inverse) {
  if constexpr (N == 1) {
    *p = to_e4m3(y[0] * inverse);
  } else {
    uint16_t pairs[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      pairs[i] = __nv_cvt_float2_to_fp8x2(make_float2(y[2 * i] * inverse, y[2 * i + 1] * inverse), __NV_SATFINITE,
                                          __NV_E4M3);
    if constexpr (N == 2) {
      *reinterpret_cast<uint16_t*>(p) = pairs[0];
    } else if constexpr (N == 4) {
      *reinterpret_cast<uint32_t*>(p) = pairs[0] | static_cast<uint32_t>(pairs[1]) << 16;
    } else {
      static_assert(N == 8, "packs of 1, 2, 4 or 8 codes");
      *reinterpret_cast<uint2*>(p) = make_uint2(pairs[0] | static_cast<uint32_t>(pairs[1]) << 16,
                                                pairs[2] | static_cast<uint32_t>(pairs[3]) << 16);
    }
  }
}

// Two codes (the low and high byte of `pair`) as an FP16 pair, the low byte in the low
// half: one conversion instruction, and exact (FP16 holds every E4M3 value).
__device__ inline unsigned e4m3x2_to_half2(unsigned pair) {
  const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return static_cast<unsigned>(halves.x) | static_cast<unsigned>(halves.y) << 16;
}

__device__ inline float2 e4m3x2_to_float2(unsigned pair) {
  const unsigned halves = e4m3x2_to_half2(pair);
  return __half22float2(*reinterpret_cast<const __half2*>(&halves));
}

__device__ inline float e4m3_to_float(uint8_t code) { return e4m3x2_to_float2(code).x; }

// 16 codes (a 16-byte piece of a row) to FP32.
__device__ inline void unpack_e4m3x16(const uint4& raw, float (&x)[16]) {
  const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 low = e4m3x2_to_float2(words[i] & 0xffffu), high = e4m3x2_to_float2(words[i] >> 16);
    x[4 * i] = low.x, x[4 * i + 1] = low.y, x[4 * i + 2] = high.x, x[4 * i + 3] = high.y;
  }
}

}  // namespace tandem::cuda
