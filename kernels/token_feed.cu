#include "token_feed.cuh"

#include <stdexcept>
#include <string>

namespace tandem::cuda {

namespace {

__global__ void feed_tokens_kernel(int32_t* token_ids, const int32_t* from_rows, const int32_t* sampled, int64_t tokens) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const int32_t row = from_rows[t];
  if (row >= 0) token_ids[t] = sampled[row];
}

}  // namespace

void feed_tokens(const Tensor& token_ids, const Tensor& from_rows, const Tensor& sampled, cudaStream_t stream) {
  const bool ints = token_ids.dtype == DType::I32 && from_rows.dtype == DType::I32 && sampled.dtype == DType::I32;
  if (!ints || token_ids.rank() != 1 || from_rows.shape != token_ids.shape || sampled.rank() != 1 ||
      token_ids.device != Device::CUDA || from_rows.device != Device::CUDA || sampled.device != Device::CUDA)
    throw std::invalid_argument("feed_tokens: token_ids " + token_ids.describe() + ", from_rows " +
                                from_rows.describe() + ", sampled " + sampled.describe() +
                                " are not I32 [T], I32 [T], I32 [R] on the GPU");
  const int64_t tokens = token_ids.shape[0];
  if (tokens == 0) return;
  constexpr int kThreads = 256;
  feed_tokens_kernel<<<static_cast<unsigned>((tokens + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      token_ids.ptr<int32_t>(), from_rows.ptr<int32_t>(), sampled.ptr<int32_t>(), tokens);
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess)
    throw std::runtime_error(std::string("feed_tokens: ") + cudaGetErrorString(status));
}

}  // namespace tandem::cuda
