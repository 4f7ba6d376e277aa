// The attention family of the CUDA backend: causal grouped-query attention within each
// packed sequence, scale 1/sqrt(head_dim). Same semantics as Ops::attention_forward and
// Ops::attention_backward (src/model/ops.h); CPU twin: CpuOps, compared in
// tests/gpu_ops_attention.cpp; speed measured by tools/bench_attention.
//
// Shapes: q, out, dq, dout [T, heads*head_dim]; k, v, dk, dv [T, kv_heads*head_dim];
// lse F32 [T, heads] (natural log of each query's softmax normaliser, written by forward,
// read by backward); cu_seqlens I32 [sequences+1] on the device. The data tensors share one
// dtype, BF16 or F32; products and sums are FP32. Backward OVERWRITES dq, dk, dv: each
// gradient row is written once, by the one thread that sums it (no zeroed buffer needed).
//
// Two paths, chosen per call:
// - BF16 with head_dim 16, 32, 64 or 128 and 16-byte aligned tensors: flash-attention 2
//   tiles on the tensor cores (mma.sync m16n8k16), T×T scores never kept past a call.
//   Backward runs three kernels, all deterministic (no atomics): rowsum(dO∘O) into
//   scratch.row_dots, one per key tile for dk/dv (recomputing the probabilities from lse),
//   then one per query tile for dq. When scratch.score_grads has room for the dS tiles of
//   any packing of the call's tokens (64×64 BF16 tiles, about heads·T² bytes), the key-tile
//   kernel stores them there and dq is one product a tile; otherwise dq recomputes them.
// - Anything else (F32, other head sizes up to 256): one warp per row, scalar FP32 math.
//
// cu_seqlens values are not read on the host (no synchronisation): they must follow the
// rules CpuOps checks (0 first, T last, never decreasing). Values that break them give
// wrong results but never an access outside the tensors.
#pragma once
#include <cuda_runtime.h>

#include "model/ops.h"
#include "tensor/tensor.h"

namespace tandem::cuda {

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_seqlens, int heads, int kv_heads, cudaStream_t stream);

// The BF16 elements scratch.score_grads needs for attention_backward to store dS: more
// than any packing of `tokens` into `sequences` gives (about heads·tokens² bytes).
int64_t attention_score_grad_elements(int64_t tokens, int64_t sequences, int heads);

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens, int heads, int kv_heads, const AttentionScratch& scratch,
                        cudaStream_t stream);

}  // namespace tandem::cuda
