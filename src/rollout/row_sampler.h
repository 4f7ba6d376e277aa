// The sampling of one engine step: a token for each scheduled sequence from its row of
// the logits, on the backend that holds them. The random draw of each row comes from the
// host (the request's own stream, see sampler.h), so both backends pick tokens by the same
// rule and a request's tokens do not depend on where it ran.
//
// A step is stage() -> launch() -> results(): staging happens before the step's device
// work is queued, and launch() is part of that work, so on CUDA it can be captured into
// the step's graph while the per-step values still change between replays.
#pragma once
#include <span>

#include "rollout/sampler.h"
#include "tensor/tensor.h"

namespace tandem {

struct SampleRow {
  float temperature = 0;  // 0: greedy
  int top_k = 0;
  float top_p = 1;
  double u = 0;  // the request's uniform draw in [0, 1); unused when greedy

  SamplingParams params() const {
    SamplingParams params;
    params.temperature = temperature;
    params.top_k = top_k;
    params.top_p = top_p;
    return params;
  }
};

class RowSampler {
 public:
  virtual ~RowSampler() = default;
  // The rows of the next launch, in logits row order.
  virtual void stage(std::span<const SampleRow> rows) = 0;
  // Draws from logits [rows, vocab]; rows past the staged ones are padding and are ignored.
  virtual void launch(const Tensor& logits) = 0;
  // One token per staged row; waits for the launch to finish.
  virtual std::span<const SampledToken> results() = 0;
};

}  // namespace tandem
