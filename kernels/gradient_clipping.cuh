// The pieces of global-norm gradient clipping on the GPU; CPU twins gradient_square_sum
// and scale_gradients (src/train/gradient_clipping.h), compared in
// tests/gpu_gradient_clipping.cpp.
#pragma once
#include <cstddef>
#include <cuda_runtime.h>

namespace tandem::cuda {

// Doubles of scratch square_sum needs besides its result.
inline constexpr int kSquareSumBlocks = 264;

// *result (device memory) = the sum of squares of count floats, accumulated in double.
// The same bits on every run: a fixed grid whose threads each sum a fixed strided share,
// reduced in a fixed tree per block into `partials` (kSquareSumBlocks doubles), then one
// block over the partials. No atomics.
void square_sum(double* result, double* partials, const float* data, size_t count, cudaStream_t stream);

// data[i] *= factor, rounded as the CPU twin's FP32 product.
void scale(float* data, size_t count, float factor, cudaStream_t stream);

}  // namespace tandem::cuda
