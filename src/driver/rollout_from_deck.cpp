#include "driver/rollout_from_deck.h"

#include <algorithm>

#include "driver/grpo_step.h"
#include "tasks/arithmetic_task.h"
#include "tasks/countdown_task.h"
#include "tasks/jsonl_task.h"

namespace tandem {

namespace {

// The longest prompt in ids: over every line of a prompt file, or over a sample of a
// generated task's prompts with room for longer draws.
int64_t longest_prompt(const Task& task, const PromptFormat& format) {
  const auto* file = dynamic_cast<const JsonlTask*>(&task);
  const uint64_t count = file ? file->size() : 64;
  size_t longest = 0;
  for (uint64_t i = 0; i < count; ++i)
    longest = std::max(longest, format.input_ids(format.input_text(task.sample(i).text)).size());
  return static_cast<int64_t>(longest) + (file ? 0 : 8);
}

}  // namespace

int64_t sequence_tokens_from_deck(const Deck& deck, const Task& task, const PromptFormat& format) {
  return longest_prompt(task, format) + deck.get<int64_t>("grpo.max-new-tokens");
}

std::unique_ptr<Task> task_from_deck(const Deck& deck) {
  const uint64_t seed = static_cast<uint64_t>(deck.get<int64_t>("run.seed"));
  // A pretrained model is asked in sentences and answers in tags; a model from scratch
  // reads the compact form through its character tokenizer.
  const PromptStyle style = deck.get<std::string>("model.path").empty() ? PromptStyle::Compact : PromptStyle::Instruct;
  const std::string name = deck.get<std::string>("task.name");
  if (name == "jsonl") {
    JsonlTaskSettings settings;
    settings.path = deck.get<std::string>("task.path");
    settings.match = answer_match_from_name(deck.get<std::string>("task.reward"));
    settings.seed = seed;
    return std::make_unique<JsonlTask>(settings);
  }
  if (name == "countdown") {
    CountdownSettings settings;
    settings.seed = seed;
    settings.numbers = static_cast<int>(deck.get<int64_t>("task.numbers"));
    settings.max_number = deck.get<int64_t>("task.max-number");
    settings.max_target = deck.get<int64_t>("task.max-target");
    settings.style = style;
    return std::make_unique<CountdownTask>(settings);
  }
  ArithmeticSettings settings;
  settings.seed = seed;
  settings.digits = static_cast<int>(deck.get<int64_t>("task.digits"));
  settings.operations = deck.get<std::string>("task.operations");
  settings.style = style;
  return std::make_unique<ArithmeticTask>(settings);
}

PromptFormat prompt_format_from_deck(const Deck& deck, const Task& task) {
  const std::string path = deck.get<std::string>("model.path");
  if (path.empty()) return PromptFormat::for_alphabet(task.alphabet());
  ChatOptions chat;
  chat.enable_thinking = deck.get<bool>("task.thinking");
  return PromptFormat::from_hf_folder(path, chat);
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
  return options;
}

}  // namespace tandem
