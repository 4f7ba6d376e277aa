// Token embedding lookup on the GPU and its backward scatter. CPU twin:
// CpuOps::embedding_forward/backward (src/model/cpu_ops.cpp), compared in
// tests/gpu_ops_pointwise.cpp.
//
// The backward pass is deterministic: token ids are sorted (a stable radix sort, so equal
// ids keep their token order) and each vocabulary row adds its tokens' gradients in
// ascending token order, the order CpuOps uses. Results are bit-identical from run to
// run and to CpuOps, with no atomics.
//
// Token ids are not checked against the vocabulary here (that would need a device->host
// sync); the caller checks them on the host. An id outside [0, V) gives a NaN row in the
// forward output, so the loss shows it, and is skipped by the backward pass.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// out[t] = table[ids[t]]: out [T, C] and table [V, C] of one data dtype, ids I32 [T].
void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids, cudaStream_t stream);
// dtable[ids[t]] += dout[t]: dtable F32 [V, C], dout [T, C] F32 or BF16, ids I32 [T].
// Uses stream-ordered scratch memory of about 16·T bytes plus the sort's temporary.
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, cudaStream_t stream);

}  // namespace tandem::cuda
