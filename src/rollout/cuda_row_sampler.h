// RowSampler on the GPU: CudaSampler on the engine's stream. results() waits for the
// stream, so a step's tokens are read after the step's graph (or kernels) has run.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "rollout/cuda_sampler.h"
#include "rollout/row_sampler.h"

namespace tandem {

class CudaRowSampler final : public RowSampler {
 public:
  CudaRowSampler(cudaStream_t stream, int64_t max_rows) : stream_(stream), sampler_(max_rows) {}

  void stage(std::span<const SampleRow> rows) override;
  void launch(const Tensor& logits) override { sampler_.launch(logits, stream_); }
  std::span<const SampledToken> results() override;

 private:
  cudaStream_t stream_;
  CudaSampler sampler_;
  std::vector<SamplingParams> params_;
  std::vector<double> draws_;
  std::vector<SampledToken> results_;
};

}  // namespace tandem
