// Whole-tensor operations on the GPU: zero and copy. CPU twins: CpuOps::zero and copy
// (src/model/cpu_ops.cpp), compared in tests/gpu_ops_pointwise.cpp.
#pragma once
#include <cuda_runtime.h>


#include "tensor/tensor.h"

namespace tandem::cuda {

// dst = 0, any dtype.
void zero(const Tensor& dst, cudaStream_t stream);
// dst = src: same dtype and shape, both on the GPU.
void copy(const Tensor& dst, const Tensor& src, cudaStream_t stream);

}  // namespace tandem::cuda
