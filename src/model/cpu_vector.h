// The FP32 inner loops of the CPU reference ops. One copy, so that the trainer's attention
// (CpuOps) and the rollout's (CpuPagedAttention) sum in the same order and agree bit for
// bit, as tests/test_rollout_attention.cpp checks.
#pragma once
#include <cstdint>

namespace tandem::cpu_vector {

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += a·x
inline void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace tandem::cpu_vector
