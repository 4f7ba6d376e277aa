// Attention's inputs in one kernel for the engine's and the trainer's forward passes:
// per-head RMSNorm (Qwen3's qk_norm) and RoPE of q and k together, where the unfused
// sequence takes four kernels (two norms, two rotations) and one launch is worth more
// than the work at decode sizes.
// CPU twin: CpuOps::qk_norm_rope_forward (rmsnorm_forward then rope_forward per tensor),
// compared in tests/gpu_ops_pointwise.cpp.
#pragma once
#include <cuda_runtime.h>

#include "model/ops.h"  // ScaledRows
#include "rollout/paged_attention.h"
#include "tensor/tensor.h"

namespace tandem::cuda {

// A head's pairs are held in the registers of at most one warp: 16 elements a lane.
inline constexpr int64_t kQkNormRopeMaxHeadDim = 512;

// q_out = rope(rmsnorm_per_head(q) * q_norm), k_out likewise with k_norm: q, q_out [T,
// heads*head_dim], k, k_out [T, kv_heads*head_dim] of one data dtype (F32 or BF16), the
// weights [head_dim] of that dtype or both empty (rope alone). Outputs may alias inputs.
// The normalised values stay FP32 through the rotation: one rounding per output.
// q_rstd F32 [T*heads] and k_rstd F32 [T*kv_heads], when given (both, and only with the
// weights), receive each head's 1/rms for rmsnorm_backward (the trainer keeps them); the
// engine passes both empty.
void qk_norm_rope_forward(const Tensor& q_out, const Tensor& k_out, const Tensor& q, const Tensor& k,
                          const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                          int heads, int kv_heads, float eps, const Tensor& q_rstd, const Tensor& k_rstd,
                          cudaStream_t stream);

// The engine's attention inputs straight from its fused q|k|v projection: qkv [T,
// (heads + 2·kv_heads)·head_dim], each row a token's q heads, k heads, v heads. Writes
// q_out [T, heads·head_dim] as qk_norm_rope_forward does, and each token's normalised,
// rotated k and its v into row slots[t] of the cache layer's keys and values ([rows,
// kv_heads·head_dim], the working dtype's or F8_E4M3 codes with their scales), as
// paged_store does (a slot outside the rows is skipped). One kernel instead of a column
// split, qk_norm_rope_forward and paged_store. qkv's row scales, if any, apply first.
void qkv_norm_rope_store(const Tensor& q_out, const CacheLayer& cache, const ScaledRows& qkv, const Tensor& q_norm,
                         const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq, const Tensor& slots,
                         int heads, int kv_heads, float eps, cudaStream_t stream);

// qkv_norm_rope_store's checks of its arguments, for an op (named `op`) that takes the
// same ones; returns whether the norm weights are there.
bool check_qkv_norm_rope_store(const char* op, const Tensor& q_out, const CacheLayer& cache, const ScaledRows& qkv,
                               const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                               const Tensor& inv_freq, const Tensor& slots, int heads, int kv_heads);

}  // namespace tandem::cuda
