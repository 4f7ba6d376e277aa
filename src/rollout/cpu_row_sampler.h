// RowSampler on the host: the reference Sampler on each row of FP32 logits in host memory.
// Work runs when it is queued, so launch() has the results at once; they are kept in two
// slots, as the GPU sampler's, for the two steps that may be in flight.
#pragma once
#include <cstdint>
#include <vector>

#include "rollout/row_sampler.h"

namespace tandem {

class CpuRowSampler final : public RowSampler {
 public:
  void stage(std::span<const SampleRow> rows) override;
  void feed(const Tensor& token_ids, const Tensor& from_rows) override;
  void launch(const Tensor& logits) override;
  void send() override {}
  std::span<const SampledToken> results() override;

 private:
  static constexpr int kSlots = 2;
  Sampler sampler_;
  std::vector<SampleRow> rows_;
  std::vector<SampledToken> results_[kSlots];
  int64_t launched_ = 0, read_ = 0;
};

}  // namespace tandem
