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

CudaSampler::CudaSampler(int64_t max_rows, int64_t vocab) : max_rows_(max_rows), vocab_(vocab) {
  if (max_rows < 1 || vocab < 1)
    throw std::invalid_argument("CudaSampler: max_rows and vocab must be >= 1, got " + std::to_string(max_rows) +
                                " and " + std::to_string(vocab));
  const size_t bytes = kFields * static_cast<size_t>(max_rows) * 4;
  try {
    check_cuda(cudaMallocHost(&host_, kSlots * bytes), "cudaMallocHost of the staging buffers");
    check_cuda(cudaMalloc(&device_, bytes), "cudaMalloc of the per-row buffers");
    check_cuda(cudaMalloc(&workspace_, workspace_bytes() + max_rows * sizeof(int32_t)),
               "cudaMalloc of the sampling workspace");
    check_cuda(cudaMemset(static_cast<char*>(workspace_) + workspace_bytes(), 0, max_rows * sizeof(int32_t)),
               "cudaMemset of the sampler's tile counts");
    for (cudaEvent_t& event : copied_) check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    release();
    throw;
  }
}

CudaSampler::~CudaSampler() { release(); }

size_t CudaSampler::workspace_bytes() const { return cuda::sample_tokens_workspace_bytes(max_rows_, vocab_); }

void CudaSampler::release() {
  for (cudaEvent_t event : copied_)
    if (event) cudaEventDestroy(event);
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
  if (staged_ - read_ >= kSlots)
    throw std::logic_error("CudaSampler::stage: " + std::to_string(staged_ - read_) +
                           " steps' results are still unread; their pinned slots are in use");
  for (int64_t b = 0; b < rows; ++b) {
    host<float>(staged_, kTemperature)[b] = params[b].temperature;
    host<int32_t>(staged_, kTopK)[b] = params[b].top_k;
    host<float>(staged_, kTopP)[b] = params[b].top_p;
    // Rounding to float must not reach 1: u = 1 would select past the last token.
    host<float>(staged_, kUniform)[b] = std::fmin(static_cast<float>(u[b]), std::nextafter(1.0f, 0.0f));
  }
  check_cuda(cudaMemcpyAsync(device_, host<char>(staged_, kTemperature), kInputs * max_rows_ * 4,
                             cudaMemcpyHostToDevice, stream),
             "copy of the per-row parameters");
  ++staged_;
}

void CudaSampler::launch(const Tensor& logits, cudaStream_t stream) {
  if (logits.rank() != 2 || logits.shape[0] > max_rows_ || logits.shape[1] > vocab_)
    throw std::invalid_argument("CudaSampler::launch: logits " + logits.describe() + " is not [rows <= " +
                                std::to_string(max_rows_) + ", vocab <= " + std::to_string(vocab_) + "]");
  const int64_t rows = logits.shape[0];
  cuda::sample_tokens(device(kIds, DType::I32, rows), device(kLogprobs, DType::F32, rows), logits,
                      device(kTemperature, DType::F32, rows), device(kTopK, DType::I32, rows),
                      device(kTopP, DType::F32, rows), device(kUniform, DType::F32, rows),
                      Tensor::view(workspace_, DType::U8, Device::CUDA, {static_cast<int64_t>(workspace_bytes())}),
                      Tensor::view(static_cast<char*>(workspace_) + workspace_bytes(), DType::I32, Device::CUDA,
                                   {max_rows_}),
                      stream);
}

void CudaSampler::send(cudaStream_t stream) {
  if (sent_ - read_ >= kSlots)
    throw std::logic_error("CudaSampler::send: " + std::to_string(sent_ - read_) + " results are still unread");
  check_cuda(cudaMemcpyAsync(host<char>(sent_, kIds), static_cast<char*>(device_) + kIds * max_rows_ * 4,
                             (kFields - kIds) * max_rows_ * 4, cudaMemcpyDeviceToHost, stream),
             "copy of the sampled tokens");
  check_cuda(cudaEventRecord(copied_[sent_ % kSlots], stream), "cudaEventRecord");
  ++sent_;
}

std::vector<SampledToken> CudaSampler::results(int64_t rows) {
  if (rows > max_rows_)
    throw std::invalid_argument("CudaSampler::results: " + std::to_string(rows) + " rows of at most " +
                                std::to_string(max_rows_));
  if (read_ == sent_) throw std::logic_error("CudaSampler::results: no results were sent");
  if (const cudaError_t status = cudaEventSynchronize(copied_[read_ % kSlots]); status != cudaSuccess)
    throw std::runtime_error(std::string("the GPU failed before the sampled tokens came back: ") +
                             cudaGetErrorString(status));
  std::vector<SampledToken> tokens(rows);
  for (int64_t b = 0; b < rows; ++b) tokens[b] = {host<int32_t>(read_, kIds)[b], host<float>(read_, kLogprobs)[b]};
  ++read_;
  return tokens;
}

}  // namespace tandem
