#include "rollout/cpu_row_sampler.h"

#include <stdexcept>
#include <string>

namespace tandem {

void CpuRowSampler::stage(std::span<const SampleRow> rows) { rows_.assign(rows.begin(), rows.end()); }

void CpuRowSampler::feed(const Tensor& token_ids, const Tensor& from_rows) {
  if (token_ids.device != Device::CPU || from_rows.device != Device::CPU || token_ids.dtype != DType::I32 ||
      from_rows.dtype != DType::I32 || token_ids.rank() != 1 || from_rows.shape != token_ids.shape)
    throw std::invalid_argument("CpuRowSampler::feed: token_ids " + token_ids.describe() + " and from_rows " +
                                from_rows.describe() + " are not I32 [T] host tensors");
  const std::vector<SampledToken>* sampled = launched_ > 0 ? &results_[(launched_ - 1) % kSlots] : nullptr;
  for (int64_t t = 0; t < token_ids.shape[0]; ++t) {
    const int32_t row = from_rows.ptr<int32_t>()[t];
    if (row < 0) continue;
    if (!sampled || row >= static_cast<int64_t>(sampled->size()))
      throw std::logic_error("CpuRowSampler::feed: token " + std::to_string(t) + " asks for row " + std::to_string(row) +
                             " of a launch with " + std::to_string(sampled ? sampled->size() : 0) + " rows");
    token_ids.ptr<int32_t>()[t] = (*sampled)[row].id;
  }
}

void CpuRowSampler::launch(const Tensor& logits) {
  if (logits.device != Device::CPU || logits.dtype != DType::F32 || logits.shape.size() != 2 ||
      logits.shape[0] < static_cast<int64_t>(rows_.size()))
    throw std::invalid_argument("CpuRowSampler: logits " + logits.describe() + " are not F32 host rows for " +
                                std::to_string(rows_.size()) + " sequences");
  if (launched_ - read_ >= kSlots)
    throw std::logic_error("CpuRowSampler::launch: " + std::to_string(launched_ - read_) + " results are still unread");
  const int64_t vocab = logits.shape[1];
  std::vector<SampledToken>& results = results_[launched_ % kSlots];
  results.resize(rows_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    results[r] = sampler_.sample(std::span<const float>(logits.ptr<float>() + r * vocab, vocab), rows_[r].params(),
                                 rows_[r].u);
  }
  ++launched_;
}

std::span<const SampledToken> CpuRowSampler::results() {
  if (read_ == launched_) throw std::logic_error("CpuRowSampler::results: nothing was launched");
  return results_[read_++ % kSlots];
}

}  // namespace tandem
