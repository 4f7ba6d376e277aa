// Paged attention of the rollout engine on the GPU: the kernels behind CudaPagedAttention
// (src/rollout/cuda_paged_attention.h). Semantics: src/rollout/paged_attention.h; CPU twin:
// CpuPagedAttention, compared in tests/gpu_paged_attention.cpp; speed: tools/bench_paged_attention.
//
// Shapes: the cache layer's keys, values [rows, kv_heads*head_dim]; k, v [T,
// kv_heads*head_dim]; q, out [T, heads*head_dim], all of one dtype, BF16 or F32, but for
// a cache of F8_E4M3 codes with F32 scales [rows, kv_heads] (rollout/paged_attention.h);
// the batch tensors I32 on the device; workspace F32 (split-K partials, see
// paged_workspace_floats). Every path reads a coded cache, 16 codes at a time on the
// decode and tensor-core paths (head_dim a multiple of 16; the decode kernel for GQA
// groups of 1 or 2, whose queries and sums of 16 dims a lane fit its registers).
//
// Three paths for attend, chosen per call from dtypes, shapes and alignment:
// - Decode steps (T == B: one query per sequence), BF16, head_dim 64 or 128, GQA groups
//   of 1, 2 or 4 (16-byte aligned tensors): a block per (sequence, kv head, split) whose
//   4 warps stream disjoint 8- or 16-key stages of the cache through rings of their own
//   (cp.async, 2 or 3 stages each) and take the products on the tensor cores; the warps
//   merge by log-sum-exp at the end. Split-K only when the B·kv_heads blocks leave the
//   device's resident slots empty (small batches). Through paged_attend_qkv the same
//   kernel also makes its queries and the new keys and values from the q|k|v projection.
// - Other BF16 steps with head_dim 16, 32, 64 or 128 (16-byte aligned): a block serves every
//   query head of one kv head (or 16/64 of them when a group is larger) for a tile of
//   queries of one sequence, so each key and value row is read once per tile; keys stream
//   through shared memory in chunks of 64 (cp.async, double-buffered) and meet Q on the
//   tensor cores. The 4 warps split the rows when a tile has many (prefill) and the keys
//   when it has few (decode with larger groups: 4 warps × 16 keys of every chunk). Split-K (flash-decoding):
//   each sequence's keys are cut into up to `splits` equal ranges, one block each, whose
//   FP32 partial results and log-sum-exps a second kernel combines.
// - Anything else (F32, other head sizes up to 256): one warp per (token, head), FP32.
//
// CUDA graphs: nothing here allocates or synchronises, and every launch configuration
// (the path, the split count, the grids) follows from shapes, pointers' alignment and
// the device alone. The contents of cu_queries, context_lens, block_tables and slots
// are read on the device only, so a captured step replays correctly with new contents.
// Contents that break the rules CpuPagedAttention checks give wrong rows but never an
// access outside the tensors: slots outside the cache are skipped, blocks outside it
// read as zeros, and lengths are clamped to the tensors.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "rollout/paged_attention.h"
#include "tensor/tensor.h"

namespace tandem::cuda {

// keys[slots[t]] = k[t] and values[slots[t]] = v[t] (as codes and scales per head of a
// coded cache).
void paged_store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots, cudaStream_t stream);

// out = causal GQA attention of q against the cached rows the batch names.
void paged_attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch, int heads,
                  int kv_heads, const Tensor& workspace, cudaStream_t stream);

// qkv_norm_rope_store (kernels/qk_norm_rope.cuh) into batch.slots, then paged_attend of
// its queries, which q_scratch [T, heads·head_dim] holds between them. A step the decode
// kernel runs (BF16, 16-byte aligned) takes both in that kernel and leaves q_scratch
// unwritten: each block normalises and rotates its group's queries into shared memory,
// and the block whose keys end at a sequence's new token stores that token's key and
// value and takes them from shared memory, not from the cache row it writes.
void paged_attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache, const ScaledRows& qkv,
                      const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                      const PagedBatch& batch, int heads, int kv_heads, float eps, const Tensor& workspace,
                      cudaStream_t stream);

// F32 elements of a workspace that gives every step of up to `max_tokens` new tokens in
// up to `max_sequences` sequences on the current device its full split count. A smaller
// workspace is safe: steps then split less, down to one range (which needs none).
size_t paged_workspace_floats(int64_t max_tokens, int64_t max_sequences, int heads, int kv_heads, int head_dim);

// Lets the kernels use the shared memory they need; called once before the first
// capture (cudaFuncSetAttribute is not a stream operation). Idempotent.
void paged_attention_setup();

}  // namespace tandem::cuda
