// The backward of rotary position embedding on the GPU, in place, Hugging Face's
// rotate_half pairing (the forward rotation is fused into qk_norm_rope.cuh's kernels).
// CPU twin: CpuOps::rope_backward (src/model/cpu_ops.cpp), compared in
// tests/gpu_ops_pointwise.cpp.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// dx [T, heads*head_dim] (F32 or BF16): dims i and i + head_dim/2 of every head rotate
// back by positions[t] * inv_freq[i]; positions I32 [T], inv_freq F32 [head_dim/2].
void rope_backward(const Tensor& dx, const Tensor& positions, const Tensor& inv_freq, int heads,
                   cudaStream_t stream);

}  // namespace tandem::cuda
