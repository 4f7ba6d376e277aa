// FP32 paged attention on the host, the reference for the CUDA kernels. Each query row
// is computed as CpuOps::attention_forward computes it (scores, max, exp, sum, weighted
// values, in that order), so on equal inputs the two agree bit for bit. An F8_E4M3 cache
// (rollout/paged_attention.h) is read as code · scale in FP32, then the same.
#pragma once
#include "rollout/paged_attention.h"

namespace tandem {

class CpuPagedAttention final : public PagedAttention {
 public:
  void store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots) override;
  void attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch, int heads,
              int kv_heads) override;
  // store_qkv into batch.slots, then attend of q_scratch.
  void attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache, const ScaledRows& qkv,
                  const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                  const PagedBatch& batch, int heads, int kv_heads, float eps) override;
  // attend_qkv's store: q_out [T, heads·head_dim] gets the queries; the reference for the
  // CUDA kernels' stores.
  void store_qkv(const Tensor& q_out, const CacheLayer& cache, const ScaledRows& qkv, const Tensor& q_norm,
                 const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq, const Tensor& slots, int heads,
                 int kv_heads, float eps);
};

}  // namespace tandem
