#include "rollout/cuda_sampler.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "sampling.cuh"

namespace tandem {

namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CudaSampler: ") + what + ": " + cudaGetErrorString(status));
}

}  // namespace

CudaSampler::CudaSampler(int64_t max_rows) : max_rows_(max_rows) {
  if (max_rows < 1) throw std::invalid_argument("CudaSampler: max_rows must be >= 1, got " + std::to_string(max_rows));
  const size_t bytes = kFields * static_cast<size_t>(max_rows) * 4;
  check_cuda(cudaMallocHost(&host_, bytes), "cudaMallocHost of the staging buffer");
  if (const cudaError_t status = cudaMalloc(&device_, bytes); status != cudaSuccess) {
    cudaFreeHost(host_);
    check_cuda(status, "cudaMalloc of the per-row buffers");
  }
  if (const cudaError_t status = cudaMalloc(&workspace_, cuda::sample_tokens_workspace_bytes(max_rows));
      status != cudaSuccess) {
    cudaFree(device_);
    cudaFreeHost(host_);
    check_cuda(status, "cudaMalloc of the sampling workspace");
  }
}

CudaSampler::~CudaSampler() {
  cudaFree(workspace_);
  cudaFree(device_);
  cudaFreeHost(host_);
}

Tensor CudaSampler::device(Field field, DType dtype, int64_t rows) const {
  return Tensor::view(static_cast<char*>(device_) + field * max_rows_ * 4, dtype, Device::CUDA, {rows});
}

void CudaSampler::stage(std::span<const SamplingParams> params, std::span<const double> u, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(params.size());
  if (rows > max_rows_ || u.size() != params.size())
    throw std::invalid_argument("CudaSampler::stage: " + std::to_string(rows) + " rows of parameters and " +
                                std::to_string(u.size()) + " draws for at most " + std::to_string(max_rows_) + " rows");
  for (int64_t b = 0; b < rows; ++b) {
    host<float>(kTemperature)[b] = params[b].temperature;
    host<int32_t>(kTopK)[b] = params[b].top_k;
    host<float>(kTopP)[b] = params[b].top_p;
    // Rounding to float must not reach 1: u = 1 would select past the last token.
    host<float>(kUniform)[b] = std::fmin(static_cast<float>(u[b]), std::nextafter(1.0f, 0.0f));
  }
  check_cuda(cudaMemcpyAsync(device_, host_, kInputs * max_rows_ * 4, cudaMemcpyHostToDevice, stream),
             "copy of the per-row parameters");
}

void CudaSampler::launch(const Tensor& logits, cudaStream_t stream) {
  if (logits.rank() != 2 || logits.shape[0] > max_rows_)
    throw std::invalid_argument("CudaSampler::launch: logits " + logits.describe() + " is not [rows <= " +
                                std::to_string(max_rows_) + ", vocab]");
  const int64_t rows = logits.shape[0];
  cuda::sample_tokens(device(kIds, DType::I32, rows), device(kLogprobs, DType::F32, rows), logits,
                      device(kTemperature, DType::F32, rows), device(kTopK, DType::I32, rows),
                      device(kTopP, DType::F32, rows), device(kUniform, DType::F32, rows),
                      Tensor::view(workspace_, DType::U8, Device::CUDA,
                                   {static_cast<int64_t>(cuda::sample_tokens_workspace_bytes(max_rows_))}),
                      stream);
  check_cuda(cudaMemcpyAsync(host<char>(kIds), static_cast<char*>(device_) + kIds * max_rows_ * 4,
                             (kFields - kIds) * max_rows_ * 4, cudaMemcpyDeviceToHost, stream),
             "copy of the sampled tokens");
}

std::vector<SampledToken> CudaSampler::results(int64_t rows) const {
  if (rows > max_rows_)
    throw std::invalid_argument("CudaSampler::results: " + std::to_string(rows) + " rows of at most " +
                                std::to_string(max_rows_));
  std::vector<SampledToken> tokens(rows);
  for (int64_t b = 0; b < rows; ++b) {
    tokens[b] = {host<int32_t>(kIds)[b], host<float>(kLogprobs)[b]};
    if (tokens[b].id < 0)
      throw std::runtime_error("CudaSampler::results: the logits of row " + std::to_string(b) +
                               " hold a NaN or +inf, or only -inf");
  }
  return tokens;
}

}  // namespace tandem
