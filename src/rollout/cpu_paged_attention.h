// FP32 paged attention on the host, the reference for the CUDA kernels. Each query row
// is computed as CpuOps::attention_forward computes it (scores, max, exp, sum, weighted
// values, in that order), so on equal inputs the two agree bit for bit.
#pragma once
#include "rollout/paged_attention.h"

namespace tandem {

class CpuPagedAttention final : public PagedAttention {
 public:
  void store(const Tensor& key_cache, const Tensor& value_cache, const Tensor& k, const Tensor& v,
             const Tensor& slots) override;
  void store_qkv(const Tensor& q_out, const Tensor& key_cache, const Tensor& value_cache, const Tensor& qkv,
                 const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                 const Tensor& slots, int heads, int kv_heads, float eps) override;
  void attend(const Tensor& out, const Tensor& q, const Tensor& key_cache, const Tensor& value_cache,
              const PagedBatch& batch, int heads, int kv_heads) override;
};

}  // namespace tandem
