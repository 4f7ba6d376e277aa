// RowSampler on the host: the reference Sampler on each row of FP32 logits in host memory.
#pragma once
#include <vector>

#include "rollout/row_sampler.h"

namespace tandem {

class CpuRowSampler final : public RowSampler {
 public:
  void stage(std::span<const SampleRow> rows) override;
  void launch(const Tensor& logits) override;
  std::span<const SampledToken> results() override { return results_; }

 private:
  Sampler sampler_;
  std::vector<SampleRow> rows_;
  std::vector<SampledToken> results_;
};

}  // namespace tandem
