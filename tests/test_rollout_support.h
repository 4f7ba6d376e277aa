// Rollout engines on the CPU backend over the tiny random models of the model tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "rollout/engine.h"
#include "tensor/memory_pool.h"
#include "test_model_support.h"

namespace tandem::testing {

inline EngineOptions small_engine_options() {
  EngineOptions options;
  options.kv_cache_bytes = size_t{1} << 20;
  options.block_size = 4;
  options.max_running = 8;
  options.max_step_tokens = 64;
  return options;
}

// A tiny model with room for trainer-side forwards of up to 512 tokens, and engines on it.
struct RolloutRig {
  explicit RolloutRig(const ModelConfig& config, uint32_t seed = 7)
      : model(config, {512, 32}, seed), pool(MemoryPool::create(Device::CPU)) {}

  std::unique_ptr<Engine> make_engine(const EngineOptions& options = small_engine_options(),
                                      const Tokenizer* tokenizer = nullptr) {
    return std::make_unique<Engine>(model.config, model.params, *pool, options, tokenizer);
  }

  TinyModel model;
  std::unique_ptr<MemoryPool> pool;
};

inline std::vector<int32_t> random_prompt(size_t length, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(length);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % vocab);
  return prompt;
}

// log softmax(row / temperature)[token] in double, as the trainer recomputes it.
inline double reference_logprob(const float* row, int vocab, int32_t token, double temperature) {
  double max = -INFINITY, sum = 0;
  for (int v = 0; v < vocab; ++v) max = std::max(max, row[v] / temperature);
  for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] / temperature - max);
  return row[token] / temperature - max - std::log(sum);
}

// The largest difference between a completion's recorded log-probs and the trainer's log
// softmax(logits / T) of the same tokens (T 1 for greedy requests), from one packed
// trainer forward (CPU, FP32) over every prompt + completion.
inline double largest_logprob_gap(TinyModel& model, const std::vector<GenerationRequest>& requests,
                                  const std::vector<Completion>& completions) {
  const int V = model.config.vocab;
  std::vector<int32_t> packed, cu = {0};
  for (size_t r = 0; r < requests.size(); ++r) {
    packed.insert(packed.end(), requests[r].prompt.begin(), requests[r].prompt.end());
    packed.insert(packed.end(), completions[r].tokens.begin(), completions[r].tokens.end());
    cu.push_back(static_cast<int32_t>(packed.size()));
  }
  const Tensor logits = model.transformer.forward(model.params, model.acts, packed, cu);
  double worst = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    if (completions[r].tokens.size() != completions[r].logprobs.size()) return INFINITY;
    const int64_t first = cu[r] + static_cast<int64_t>(requests[r].prompt.size()) - 1;  // predicts token 0
    const float temperature = requests[r].sampling.temperature > 0 ? requests[r].sampling.temperature : 1.0f;
    for (size_t i = 0; i < completions[r].logprobs.size(); ++i)
      worst = std::max(worst, std::fabs(completions[r].logprobs[i] -
                                        reference_logprob(logits.ptr<float>() + (first + i) * V, V,
                                                          completions[r].tokens[i], temperature)));
  }
  return worst;
}

}  // namespace tandem::testing
