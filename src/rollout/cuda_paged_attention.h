// PagedAttention on the GPU: the kernels of kernels/paged_attention.cuh queued on one
// stream, with the split-K workspace they need. store and attend never allocate or wait,
// and their launches depend on shapes only, so an engine step can be captured in a CUDA
// graph once and replayed with new batch contents.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "model/config.h"
#include "rollout/paged_attention.h"
#include "tensor/memory_pool.h"

namespace tandem {

class CudaPagedAttention final : public PagedAttention {
 public:
  // The workspace comes from `pool` under tags::kv_cache (its contents live for one call),
  // sized so that every step of up to `max_tokens` new tokens in up to `max_sequences`
  // sequences of `config`'s heads gets its full split count.
  CudaPagedAttention(cudaStream_t stream, MemoryPool& pool, const ModelConfig& config, int64_t max_tokens,
                     int64_t max_sequences, const std::string& name);
  // A workspace the caller owns (F32 on the device, any length; see
  // cuda::paged_workspace_floats): it must outlive this object.
  CudaPagedAttention(cudaStream_t stream, const Tensor& workspace);
  ~CudaPagedAttention() override;
  CudaPagedAttention(const CudaPagedAttention&) = delete;
  CudaPagedAttention& operator=(const CudaPagedAttention&) = delete;

  void store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots) override;
  void attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch, int heads,
              int kv_heads) override;
  void attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache, const ScaledRows& qkv,
                  const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions, const Tensor& inv_freq,
                  const PagedBatch& batch, int heads, int kv_heads, float eps) override;

  const Tensor& workspace() const { return workspace_; }

 private:
  cudaStream_t stream_;
  MemoryPool* pool_ = nullptr;  // set when the workspace is ours
  Allocation* allocation_ = nullptr;
  Tensor workspace_;
};

}  // namespace tandem
