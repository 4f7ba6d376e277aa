#include "driver/task_from_deck.h"

#include <algorithm>

#include "tasks/arithmetic_task.h"
#include "tasks/countdown_task.h"
#include "tasks/jsonl_task.h"

namespace tandem {

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

int64_t longest_prompt_tokens(const Task& task, const PromptFormat& format) {
  const auto* file = dynamic_cast<const JsonlTask*>(&task);
  const uint64_t count = file ? file->size() : 64;
  size_t longest = 0;
  for (uint64_t i = 0; i < count; ++i)
    longest = std::max(longest, format.input_ids(format.input_text(task.sample(i).text)).size());
  return static_cast<int64_t>(longest) + (file ? 0 : 8);
}

}  // namespace tandem
