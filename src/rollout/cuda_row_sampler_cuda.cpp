#include "rollout/cuda_row_sampler.h"

#include <stdexcept>
#include <string>

namespace tandem {

void CudaRowSampler::stage(std::span<const SampleRow> rows) {
  params_.resize(rows.size());
  draws_.resize(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    params_[r] = rows[r].params();
    draws_[r] = rows[r].u;
  }
  sampler_.stage(params_, draws_, stream_);
}

std::span<const SampledToken> CudaRowSampler::results() {
  if (const cudaError_t status = cudaStreamSynchronize(stream_); status != cudaSuccess)
    throw std::runtime_error(std::string("engine step failed on the GPU: ") + cudaGetErrorString(status));
  results_ = sampler_.results(static_cast<int64_t>(params_.size()));
  return results_;
}

}  // namespace tandem
