// The rollout engine's sampler on the GPU: per-row sampling parameters and uniform draws
// staged from the host, tokens and log-probs sampled on device logits by
// cuda::sample_tokens (kernels/sampling.cuh), read back through pinned memory. The draws
// stay on the host, one per non-greedy row from the request's own stream
// (draw_uniform in rollout/sampler.h), so the CPU Sampler given the same draws is the twin.
//
// Per step: stage() (host), launch() (capturable in a CUDA graph: fixed buffers, no
// allocation, no sync), synchronise the stream, results(). stage() overwrites the pinned
// buffer its previous copy read from, so it must follow the previous step's sync.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "rollout/request.h"
#include "rollout/sampler.h"
#include "tensor/tensor.h"

namespace tandem {

class CudaSampler {
 public:
  explicit CudaSampler(int64_t max_rows);
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  // Row b samples with params[b] and the draw u[b] (unused when greedy); one async copy.
  void stage(std::span<const SamplingParams> params, std::span<const double> u, cudaStream_t stream);
  // Samples every row of logits [rows, V] (BF16 or F32, rows <= max_rows) with the
  // parameters last staged, and queues the copy of the results to the host.
  void launch(const Tensor& logits, cudaStream_t stream);
  // The first `rows` results of the last launch, once its stream has been synchronised.
  // Throws for a row whose logits held a NaN or +inf, or only -inf.
  std::vector<SampledToken> results(int64_t rows) const;

 private:
  // One layout on both sides, max_rows entries per field: the inputs are copied up in one
  // piece, the outputs down in another.
  enum Field { kTemperature, kTopK, kTopP, kUniform, kIds, kLogprobs, kFields };
  static constexpr int kInputs = kIds;
  template <class T>
  T* host(Field field) const { return reinterpret_cast<T*>(static_cast<char*>(host_) + field * max_rows_ * 4); }
  Tensor device(Field field, DType dtype, int64_t rows) const;

  int64_t max_rows_;
  void* host_ = nullptr;    // pinned, kFields * max_rows 4-byte entries
  void* device_ = nullptr;  // the same layout on the device
  void* workspace_ = nullptr;  // cuda::sample_tokens' tile sums for max_rows rows
};

}  // namespace tandem
