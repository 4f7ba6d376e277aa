#include "driver/rollout_from_deck.h"

#include <algorithm>

#include "driver/grpo_step.h"

namespace tandem {

int64_t sequence_tokens_from_deck(const Deck& deck, const Task& task, const PromptFormat& format) {
  return longest_prompt_tokens(task, format) + deck.get<int64_t>("grpo.max-new-tokens");
}

GroupSamplingSettings group_sampling_from_deck(const Deck& deck, const PromptFormat& format) {
  GroupSamplingSettings settings;
  settings.group_size = deck.get<int64_t>("grpo.group-size");
  settings.seed = static_cast<uint64_t>(deck.get<int64_t>("run.seed"));
  settings.sampling.temperature = static_cast<float>(deck.get<double>("grpo.temperature"));
  settings.sampling.max_new_tokens = static_cast<int>(deck.get<int64_t>("grpo.max-new-tokens"));
  settings.sampling.stop_token_ids = format.stop_ids();
  return settings;
}

EngineOptions engine_options_from_deck(const Deck& deck, const Task& task, const PromptFormat& format, int64_t sequences,
                                       DType dtype, Device device) {
  EngineOptions options;
  options.kv_cache_bytes = kv_cache_bytes(deck, device);
  options.max_running = static_cast<int>(sequences);
  options.max_step_tokens = std::max<int64_t>(deck.get<int64_t>("rollout.max-step-tokens"), sequences);
  options.max_sequence_length = sequence_tokens_from_deck(deck, task, format);
  options.dtype = dtype;
  options.fp8_kv_cache = deck.get<std::string>("rollout.kv-cache-dtype") == "fp8";
  options.fp8_weights = deck.get<std::string>("rollout.weight-dtype") == "fp8";
  options.share_prompts = deck.get<bool>("rollout.share-prompts");
  return options;
}

}  // namespace tandem
