#include "rollout/paged_attention.h"

namespace tandem {

void PagedAttention::attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache,
                                const ScaledRows& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                const Tensor& positions, const Tensor& inv_freq, const PagedBatch& batch, int heads,
                                int kv_heads, float eps) {
  store_qkv(q_scratch, cache, qkv, q_norm, k_norm, positions, inv_freq, batch.slots, heads, kv_heads, eps);
  attend(out, q_scratch, cache, batch, heads, kv_heads);
}

}  // namespace tandem
