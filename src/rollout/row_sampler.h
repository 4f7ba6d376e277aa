// The sampling of one engine step: a token for each scheduled sequence from its row of
// the logits, on the backend that holds them. The random draw of each row comes from the
// host (the request's own stream, see sampler.h), so both backends pick tokens by the same
// rule and a request's tokens do not depend on where it ran.
//
// A step is stage() -> feed() and launch() -> send() -> results(): staging happens before
// the step's device work is queued, and feed() and launch() are part of that work, so on
// CUDA they can be captured into the step's graph while the per-step values still change
// between replays. Two steps may be in flight (the engine queues a decode step while the
// one before it runs): results() reads the older, and a stage() must come after the
// results() of the step two before it.
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
  // token_ids[t] = the token the last launch sampled for its row from_rows[t], where
  // from_rows[t] >= 0; the other ids stay. I32 [T] both, in the backend's memory: the
  // tokens of a step queued before the host has the results of the step before it.
  virtual void feed(const Tensor& token_ids, const Tensor& from_rows) = 0;
  // Draws from logits [rows, vocab]; rows past the staged ones are padding and are ignored.
  virtual void launch(const Tensor& logits) = 0;
  // Queues the way of the last launch's results to the host (outside any captured work).
  virtual void send() = 0;
  // One token per staged row of the oldest launch not read yet; waits for it. The span
  // holds until the next results(). A row whose logits held a NaN or +inf, or only -inf,
  // has id -1 (the CPU sampler throws in launch() instead).
  virtual std::span<const SampledToken> results() = 0;
};

}  // namespace tandem
