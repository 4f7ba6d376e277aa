#include "rollout/cuda_row_sampler.h"

#include "token_feed.cuh"

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

void CudaRowSampler::feed(const Tensor& token_ids, const Tensor& from_rows) {
  cuda::feed_tokens(token_ids, from_rows, sampler_.sampled_ids(), stream_);
}

void CudaRowSampler::send() {
  sampler_.send(stream_);
  sent_rows_.push_back(static_cast<int64_t>(params_.size()));
}

std::span<const SampledToken> CudaRowSampler::results() {
  const int64_t rows = sent_rows_.empty() ? 0 : sent_rows_.front();
  results_ = sampler_.results(rows);  // throws when nothing was sent
  sent_rows_.erase(sent_rows_.begin());
  return results_;
}

}  // namespace tandem
