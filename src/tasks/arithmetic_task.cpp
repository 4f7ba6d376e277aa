#include "tasks/arithmetic_task.h"

#include <algorithm>
#include <stdexcept>

#include "tasks/answer_extraction.h"
#include "tasks/prompt_random.h"

namespace tandem {
namespace {

bool is_integer(std::string_view text) {
  if (text.starts_with('-')) text.remove_prefix(1);
  return !text.empty() && text.size() <= 18 && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
}

}  // namespace

ArithmeticTask::ArithmeticTask(ArithmeticSettings settings) : settings_(std::move(settings)) {
  if (settings_.digits < 1 || settings_.digits > 9)
    throw std::invalid_argument("arithmetic task: digits must be 1 to 9, got " + std::to_string(settings_.digits));
  const std::string& ops = settings_.operations;
  if (ops.empty() || ops.find_first_not_of("+-*") != std::string::npos)
    throw std::invalid_argument("arithmetic task: operations must be a non-empty subset of \"+-*\", got \"" + ops +
                                "\"");
}

Prompt ArithmeticTask::sample(uint64_t index) const {
  PromptRandom random(settings_.seed, index);
  int64_t limit = 1;
  for (int d = 0; d < settings_.digits; ++d) limit *= 10;
  const int64_t a = random.uniform(0, limit - 1);
  const int64_t b = random.uniform(0, limit - 1);
  const char op = settings_.operations[random.uniform(0, static_cast<int64_t>(settings_.operations.size()) - 1)];
  const int64_t result = op == '+' ? a + b : op == '-' ? a - b : a * b;

  Prompt prompt;
  prompt.index = index;
  prompt.answer = std::to_string(result);
  const std::string left = std::to_string(a), right = std::to_string(b);
  if (settings_.style == PromptStyle::Compact) {
    prompt.text = left + op + right + "=";
  } else {
    prompt.text = "What is " + left + " " + op + " " + right +
                  "? Give only the final number inside <answer></answer>, for example <answer>42</answer>.";
  }
  return prompt;
}

RewardBreakdown ArithmeticTask::judge(const Prompt& prompt, std::string_view completion) const {
  std::string_view answer = completion;
  if (settings_.style == PromptStyle::Instruct) {
    const auto tagged = last_tagged(completion, "<answer>", "</answer>");
    if (!tagged) return weighted_reward(settings_.weights, false, false, "no <answer>...</answer>");
    answer = *tagged;
  }
  answer = trim_ascii(answer);
  if (!is_integer(answer)) return weighted_reward(settings_.weights, false, false, "not an integer");
  if (answer != prompt.answer)
    return weighted_reward(settings_.weights, true, false, std::string(answer) + " is not " + prompt.answer);
  return weighted_reward(settings_.weights, true, true);
}

std::string ArithmeticTask::reference_completion(const Prompt& prompt) const {
  return settings_.style == PromptStyle::Instruct ? "<answer>" + prompt.answer + "</answer>" : prompt.answer;
}

std::string ArithmeticTask::alphabet() const {
  if (settings_.style == PromptStyle::Instruct) return {};
  return "0123456789=" + settings_.operations;
}

}  // namespace tandem
