// Picks the next token of one sequence from its FP32 logits: greedy at temperature 0,
// otherwise a draw from softmax(logits / temperature) restricted to the top-k tokens and
// then to the top-p nucleus of those (renormalised, as Hugging Face and vLLM apply them).
// The log-prob it reports is taken over the FULL vocabulary before any truncation.
// The random draw is separate from the selection, so the GPU sampler (cuda_sampler.h),
// fed the same uniform numbers, is this sampler's twin.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "rollout/request.h"

namespace tandem {

struct SampledToken {
  int32_t id = 0;
  float logprob = 0;
};

// A request's own random stream, seeded from (seed, request id) alone: what it draws does
// not depend on which other requests share its batch or its engine instance.
std::mt19937_64 request_rng(uint64_t seed, uint64_t request_id);

// The one uniform number in [0, 1) a token needs, drawn from the request's stream; none
// is drawn when greedy (the result is then 0 and unused), so a request's tokens are a
// function of its seed and its logits only.
double draw_uniform(const SamplingParams& params, std::mt19937_64& rng);

class Sampler {
 public:
  // The token `u` selects: the first whose running sum of kept probabilities passes u,
  // the kept tokens taken most likely first; ignored when greedy.
  SampledToken sample(std::span<const float> logits, const SamplingParams& params, double u);
  SampledToken sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng) {
    return sample(logits, params, draw_uniform(params, rng));
  }

 private:
  // Reused between calls: a vocabulary-sized buffer per call would dominate small steps.
  std::vector<float> weights_;  // exp(z - max z), z = logits / temperature
  std::vector<int32_t> order_;  // token ids, most likely first (only when truncating)
};

}  // namespace tandem
