#include "rollout/cpu_row_sampler.h"

#include <stdexcept>

namespace tandem {

void CpuRowSampler::stage(std::span<const SampleRow> rows) { rows_.assign(rows.begin(), rows.end()); }

void CpuRowSampler::launch(const Tensor& logits) {
  if (logits.device != Device::CPU || logits.dtype != DType::F32 || logits.shape.size() != 2 ||
      logits.shape[0] < static_cast<int64_t>(rows_.size()))
    throw std::invalid_argument("CpuRowSampler: logits " + logits.describe() + " are not F32 host rows for " +
                                std::to_string(rows_.size()) + " sequences");
  const int64_t vocab = logits.shape[1];
  results_.resize(rows_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    results_[r] = sampler_.sample(std::span<const float>(logits.ptr<float>() + r * vocab, vocab), rows_[r].params(),
                                  rows_[r].u);
  }
}

}  // namespace tandem
