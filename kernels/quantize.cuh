// FP8 E4M3 codes of a whole tensor with one scale, on the GPU: the engine's FP8 weights
// (Ops::quantize_fp8). CPU twin: CpuOps::quantize_fp8, compared in tests/gpu_ops_fp8.cpp.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// codes F8_E4M3 [R, C] and scale F32 [1] of x [R, C] (F32 or BF16): scale = x's largest
// magnitude / 448, codes e4m3(x / scale). Two kernels: the largest magnitude, then the codes.
void quantize_fp8(const Tensor& codes, const Tensor& scale, const Tensor& x, cudaStream_t stream);

}  // namespace tandem::cuda
