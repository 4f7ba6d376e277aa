// Attention against the paged KV cache: the one op the engine needs beyond model/ops.h,
// with one implementation per backend (CpuPagedAttention here; a CUDA one next to it).
//
// A step runs B sequences, each with n_b >= 1 new tokens laid end to end (a prompt chunk
// during prefill, one token during decode). The new tokens' keys and values are first
// stored into their cache rows; then query i of sequence b, at position
// context_lens[b] - n_b + i, attends causally to the cached positions 0..its own, GQA
// (query head h reads kv head h / (heads / kv_heads)), scale 1/sqrt(head_dim), FP32
// accumulation. Prefill and decode are the same op, so a token's output does not depend
// on whether it was computed in a prompt chunk or in a decode step.
//
// A cache in F8_E4M3 holds each (token, kv head)'s head_dim keys, and its values, as
// codes of one scale: scale = amax / 448 over the head's elements (as the working dtype
// holds them), code = e4m3(element · 448 / amax) (tensor/fp8.h; all zero when amax is 0),
// and attention reads code · scale. Half the bytes of BF16, where decode is bound by them.
#pragma once
#include "model/ops.h"  // ScaledRows
#include "tensor/tensor.h"

namespace tandem {

// One layer of the cache, as the ops read and write it.
struct CacheLayer {
  Tensor keys, values;              // [rows, kv_heads*head_dim]
  Tensor key_scales, value_scales;  // [rows, kv_heads] F32 with F8_E4M3 keys and values; empty otherwise
};

// Where a step's tokens sit in the cache, staged in the backend's memory (all I32).
struct PagedBatch {
  Tensor slots;         // [T]: cache row of each new token (block * block_size + offset)
  Tensor cu_queries;    // [B + 1]: offsets of each sequence's new tokens, from 0 to T
  Tensor context_lens;  // [B]: tokens cached per sequence once this step's are stored
  Tensor block_tables;  // [B, max_blocks]: each sequence's blocks in order (unused tail: any)
  int block_size = 16;
};

class PagedAttention {
 public:
  virtual ~PagedAttention() = default;

  // k, v: [T, kv_heads*head_dim] in the working dtype.
  virtual void store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots) = 0;
  // out, q: [T, heads*head_dim].
  virtual void attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch,
                      int heads, int kv_heads) = 0;
  // The store from a layer's fused q|k|v projection, with the rotation before it, then
  // attend: qkv [T, (heads + 2·kv_heads)·head_dim] holds each token's q, k and v heads
  // (times its row scale where qkv has scales: an FP8 projection's output); the queries and
  // the stored keys are those of Ops::qk_norm_rope_forward (q_norm and k_norm [head_dim], or
  // both empty for rope alone), the stored values v as they are. q_scratch [T,
  // heads·head_dim] may hold the queries between the store and the attention; a backend
  // may do both in one pass and leave it as it was: CudaPagedAttention does on decode
  // steps, where the kernel between them cost more in its start-up and drain than in its
  // work.
  virtual void attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache, const ScaledRows& qkv,
                          const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                          const PagedBatch& batch, int heads, int kv_heads, float eps) = 0;
};

}  // namespace tandem
