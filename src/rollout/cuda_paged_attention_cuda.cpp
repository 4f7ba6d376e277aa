#include "rollout/cuda_paged_attention.h"

#include <stdexcept>

#include "model/op_args.h"
#include "paged_attention.cuh"
#include "qk_norm_rope.cuh"

namespace tandem {

CudaPagedAttention::CudaPagedAttention(cudaStream_t stream, MemoryPool& pool, const ModelConfig& config,
                                       int64_t max_tokens, int64_t max_sequences, const std::string& name)
    : stream_(stream), pool_(&pool) {
  if (pool.device() != Device::CUDA)
    throw std::invalid_argument("CudaPagedAttention '" + name + "': the workspace pool must be on the CUDA device");
  const size_t floats =
      cuda::paged_workspace_floats(max_tokens, max_sequences, config.heads, config.kv_heads, config.head_dim);
  allocation_ = pool.allocate(tags::kv_cache, floats * sizeof(float), name);
  workspace_ = Tensor::view(allocation_->ptr, DType::F32, Device::CUDA, {static_cast<int64_t>(floats)});
  cuda::paged_attention_setup();
}

CudaPagedAttention::CudaPagedAttention(cudaStream_t stream, const Tensor& workspace)
    : stream_(stream), workspace_(workspace) {
  check_op_arg(workspace, "CudaPagedAttention", "workspace", Device::CUDA, {DType::F32}, {kAnyExtent});
  cuda::paged_attention_setup();
}

CudaPagedAttention::~CudaPagedAttention() {
  if (allocation_) {
    cudaStreamSynchronize(stream_);  // queued kernels may still write the workspace
    pool_->release(allocation_);
  }
}

void CudaPagedAttention::store(const CacheLayer& cache, const Tensor& k, const Tensor& v, const Tensor& slots) {
  cuda::paged_store(cache, k, v, slots, stream_);
}

void CudaPagedAttention::attend(const Tensor& out, const Tensor& q, const CacheLayer& cache, const PagedBatch& batch,
                                int heads, int kv_heads) {
  cuda::paged_attend(out, q, cache, batch, heads, kv_heads, workspace_, stream_);
}

void CudaPagedAttention::attend_qkv(const Tensor& out, const Tensor& q_scratch, const CacheLayer& cache,
                                    const ScaledRows& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                    const Tensor& positions, const Tensor& inv_freq, const PagedBatch& batch,
                                    int heads, int kv_heads, float eps) {
  cuda::paged_attend_qkv(out, q_scratch, cache, qkv, q_norm, k_norm, positions, inv_freq, batch, heads, kv_heads, eps,
                         workspace_, stream_);
}

}  // namespace tandem
