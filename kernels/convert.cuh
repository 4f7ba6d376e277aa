// FP32 -> BF16 conversion on the GPU (round to nearest even). CPU twin: float_to_bf16
// in src/tensor/bf16.h, compared in tests/gpu_convert.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace tandem {
void convert_f32_to_bf16_cuda(uint16_t* dst, const float* src, size_t count, cudaStream_t stream);
}
