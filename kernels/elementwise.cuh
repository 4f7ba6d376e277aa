// Whole-tensor operations on the GPU: zero, copy and the residual add. CPU
// twins: CpuOps::zero, copy and add (src/model/cpu_ops.cpp), compared in
// tests/gpu_ops_pointwise.cpp.
#pragma once
#include <cuda_runtime.h>


#include "tensor/tensor.h"

namespace tandem::cuda {

// dst = 0, any dtype.
void zero(const Tensor& dst, cudaStream_t stream);
// dst = src: same dtype and shape, both on the GPU.
void copy(const Tensor& dst, const Tensor& src, cudaStream_t stream);
// out = a + b, all [N, D] of one data dtype (F32 or BF16); out may alias a or b.
void add(const Tensor& out, const Tensor& a, const Tensor& b, cudaStream_t stream);

}  // namespace tandem::cuda
