// RowSampler on the GPU: CudaSampler on the engine's stream, and the token feed
// (kernels/token_feed.cuh) from its sampled ids. results() waits for an event recorded
// after the step's results copy, not for the stream, which may already hold the next step.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "rollout/cuda_sampler.h"
#include "rollout/row_sampler.h"

namespace tandem {

class CudaRowSampler final : public RowSampler {
 public:
  CudaRowSampler(cudaStream_t stream, int64_t max_rows, int64_t vocab)
      : stream_(stream), sampler_(max_rows, vocab) {}

  void stage(std::span<const SampleRow> rows) override;
  void feed(const Tensor& token_ids, const Tensor& from_rows) override;
  void launch(const Tensor& logits) override { sampler_.launch(logits, stream_); }
  void send() override;
  std::span<const SampledToken> results() override;

 private:
  cudaStream_t stream_;
  CudaSampler sampler_;
  std::vector<SamplingParams> params_;
  std::vector<double> draws_;
  std::vector<int64_t> sent_rows_;  // the staged rows of each launch sent and not read, oldest first
  std::vector<SampledToken> results_;
};

}  // namespace tandem
