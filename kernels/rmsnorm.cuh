// RMSNorm over the last dim on the GPU, per token ([T, hidden]) or per head
// ([T*heads, head_dim]). CPU twin: CpuOps::rmsnorm_forward/backward
// (src/model/cpu_ops.cpp), compared in tests/gpu_ops_pointwise.cpp.
//
// The weight gradient is deterministic: blocks own fixed chunks of rows (chosen from the
// shape alone), sum their rows in a fixed order, and a second kernel sums the chunks in
// order. No atomics, so a restarted run reproduces it bit for bit.
#pragma once
#include <cuda_runtime.h>

#include "model/grad_write.h"
#include "model/ops.h"  // ScaledRows
#include "tensor/tensor.h"

namespace tandem::cuda {

// Both passes take rows of up to this many elements: a row is held in the registers
// of at most one block (1024 threads, 16 elements each).
inline constexpr int64_t kRmsnormMaxColumns = 12288;

// out = x / sqrt(mean(x²) + eps) * weight: x, out [N, D] and weight [D] of one data dtype
// (F32 or BF16), rstd F32 [N] (the reciprocal std, kept for backward). out may instead be
// FP8 codes with a scale per row (Ops::rmsnorm_forward).
void rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& x, const Tensor& weight, float eps,
                     cudaStream_t stream);
// hidden += branch (times its row scales, if any; rounded to hidden's dtype), then out and
// rstd as rmsnorm_forward of the new hidden, in one kernel: the engine's residual add and
// the norm that follows it. CPU twin: CpuOps::add_rmsnorm_forward.
void add_rmsnorm_forward(const ScaledRows& out, const Tensor& rstd, const Tensor& hidden, const ScaledRows& branch,
                         const Tensor& weight, float eps, cudaStream_t stream);
// dx = or += ∂out/∂x · dout as dx_write says (dx, dout, x, weight of x's dtype; overwrite
// never reads dx), dweight F32 [D] += Σ_rows dout · x · rstd. Uses stream-ordered scratch
// memory of at most 512·D·4 bytes.
void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd, GradWrite dx_write, cudaStream_t stream);
// The backward of the per-head norm then RoPE of qk_norm_rope_forward, for q or for k, in
// one pass (Ops::rmsnorm_rope_backward; CPU twin: CpuOps::rope_backward then
// rmsnorm_backward). x, dx, dout [T, heads·head_dim]; rstd F32 [T·heads].
void rmsnorm_rope_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                           const Tensor& weight, const Tensor& rstd, const Tensor& positions, const Tensor& inv_freq,
                           int heads, cudaStream_t stream);

}  // namespace tandem::cuda
