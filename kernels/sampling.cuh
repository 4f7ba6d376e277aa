// Token sampling on the GPU, FP32 weights with FP64 sums (but for the first kernel's
// tile sums, which add FP32 sums of 8 consecutive weights): the twin of the CPU Sampler
// (src/rollout/sampler.h), fed the same uniform numbers drawn on the host from each
// request's own stream.
//
//   temperature 0: argmax, lowest index on ties (as the CPU).
//   otherwise, w = exp(logits/T - max), kept tokens chosen by inverse CDF in INDEX order:
//   the first kept token whose running sum of w passes u * (sum of kept w).
//   No top-k/top-p: every token is kept, which is the CPU's own order, so for the same
//   logits and u both pick the same token except when u * sum lands within rounding of a
//   boundary (exp differs by an ulp between libm and CUDA).
//   top-k and/or top-p: the kept set is the CPU's (most likely first, ties to the lower
//   index; the top k, then the smallest prefix holding top_p of their mass), found by a
//   bracketing search on the bits of w over a few passes of the row instead of a sort;
//   the kept tokens are then picked in index order, so the distribution matches the CPU's
//   while the token chosen for a given u may differ.
// logprobs = log softmax(logits/T)[id] over the full vocabulary (T = 1 when greedy).
// A row whose logits hold a NaN or +inf, or only -inf, gets id -1 and a NaN log-prob.
//
// Two kernels. The first reads the logits once with many CTAs per row (max, argmax and the
// sum of weights of each tile of 8192 tokens and of each chunk of 256, into the workspace);
// the last of a row's CTAs to finish combines its tiles with one warp, which settles a
// greedy row, and a full-vocabulary draw reads only the chunk it lands in. The second, one
// CTA per row, makes a truncated row's passes; its CTAs for other rows return at once.
// No allocation, no synchronisation, launch configuration from (B, V) alone: the call can
// be captured in a CUDA graph and replayed with new parameters in the same buffers.
#pragma once
#include <cuda_runtime.h>

#include "tensor/tensor.h"

namespace tandem::cuda {

// Bytes of device workspace sample_tokens needs for up to `rows` rows of up to `vocab`
// logits.
size_t sample_tokens_workspace_bytes(int64_t rows, int64_t vocab);

// ids I32 [B] and logprobs F32 [B] out; logits [B, V] BF16 or F32; per row: temperature
// F32 (0 = greedy), top_k I32 (0 = off), top_p F32 (1 = off), u F32 in [0, 1); workspace
// U8 [>= sample_tokens_workspace_bytes(B, V)], 8-byte aligned, overwritten; tiles_done I32
// [>= B], the count of each row's finished tiles: zero before the first call, and every
// call leaves it zero.
void sample_tokens(const Tensor& ids, const Tensor& logprobs, const Tensor& logits, const Tensor& temperature,
                   const Tensor& top_k, const Tensor& top_p, const Tensor& u, const Tensor& workspace,
                   const Tensor& tiles_done, cudaStream_t stream);

}  // namespace tandem::cuda
