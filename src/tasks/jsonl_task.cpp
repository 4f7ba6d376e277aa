#include "tasks/jsonl_task.h"

#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tasks/answer_extraction.h"
#include "tasks/prompt_random.h"
#include "tasks/shuffled_index.h"

namespace tandem {
namespace {

std::string without_spaces(std::string_view text) {
  std::string result;
  for (const char c : text)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') result += c;
  return result;
}

// "an array", "a string": how an error names a JSON value's type.
std::string kind_of(const nlohmann::json& value) {
  const std::string name = value.type_name();
  return (std::string("aeiou").find(name[0]) != std::string::npos ? "an " : "a ") + name;
}

}  // namespace

AnswerMatch answer_match_from_name(std::string_view name) {
  if (name == "exact") return AnswerMatch::Exact;
  if (name == "last-number") return AnswerMatch::LastNumber;
  if (name == "boxed") return AnswerMatch::Boxed;
  throw std::invalid_argument("unknown answer match '" + std::string(name) +
                              "': expected exact, last-number or boxed");
}

JsonlTask::JsonlTask(JsonlTaskSettings settings) : settings_(std::move(settings)) {
  const std::string file = settings_.path.string();
  std::ifstream in(settings_.path, std::ios::binary);
  if (!in) throw std::runtime_error(file + ": cannot open the prompt file");
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    const auto fail = [&](const std::string& reason) {
      throw std::runtime_error(file + ":" + std::to_string(line_number) + ": " + reason);
    };
    if (trim_ascii(line).empty()) continue;
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      fail(std::string("not valid JSON (") + error.what() + ")");
    }
    if (!object.is_object()) fail("expected a JSON object {\"prompt\": ..., \"answer\": ...}, got " + kind_of(object));
    const auto prompt = object.find("prompt");
    const auto answer = object.find("answer");
    if (prompt == object.end()) fail("missing key \"prompt\"");
    if (answer == object.end()) fail("missing key \"answer\"");
    if (!prompt->is_string()) fail("\"prompt\" must be a string, got " + kind_of(*prompt));
    if (!answer->is_string() && !answer->is_number())
      fail("\"answer\" must be a string or a number, got " + kind_of(*answer));
    Record record{prompt->get<std::string>(), answer->is_string() ? answer->get<std::string>() : answer->dump()};
    if (settings_.match == AnswerMatch::LastNumber && !last_number(record.answer))
      fail("the answer '" + record.answer + "' has no number for last-number matching");
    records_.push_back(std::move(record));
  }
  if (in.bad()) throw std::runtime_error(file + ": read error after line " + std::to_string(line_number));
  if (records_.empty()) throw std::runtime_error(file + ": no prompts (the file has no non-blank lines)");
}

Prompt JsonlTask::sample(uint64_t index) const {
  const uint64_t count = records_.size();
  const uint64_t epoch_key = PromptRandom(settings_.seed, index / count).next();
  const Record& record = records_[shuffled_index(index % count, count, epoch_key)];
  return Prompt{index, record.prompt, record.answer};
}

RewardBreakdown JsonlTask::judge(const Prompt& prompt, std::string_view completion) const {
  const RewardWeights& weights = settings_.weights;
  switch (settings_.match) {
    case AnswerMatch::Exact: {
      const std::string_view answer = trim_ascii(completion);
      if (answer.empty()) return weighted_reward(weights, false, false, "empty completion");
      const bool right = answer == trim_ascii(prompt.answer);
      return weighted_reward(weights, true, right, right ? "" : "not the answer");
    }
    case AnswerMatch::LastNumber: {
      const auto number = last_number(completion);
      if (!number) return weighted_reward(weights, false, false, "no number");
      const auto reference = last_number(prompt.answer);
      const bool right = reference && same_number(*number, *reference);
      return weighted_reward(weights, true, right, right ? "" : *number + " is not " + reference.value_or("a number"));
    }
    case AnswerMatch::Boxed: {
      const auto boxed = last_boxed(completion);
      if (!boxed) return weighted_reward(weights, false, false, "no \\boxed{...}");
      const std::string_view reference = last_boxed(prompt.answer).value_or(prompt.answer);
      const std::string given = without_spaces(*boxed), expected = without_spaces(reference);
      const bool right = given == expected || same_number(given, expected);
      const std::string note = right ? "" : "\\boxed{" + std::string(*boxed) + "} is not " + expected;
      return weighted_reward(weights, true, right, note);
    }
  }
  throw std::logic_error("jsonl task: unknown answer match");
}

std::string JsonlTask::reference_completion(const Prompt& prompt) const {
  if (settings_.match != AnswerMatch::Boxed) return prompt.answer;
  return "\\boxed{" + std::string(last_boxed(prompt.answer).value_or(prompt.answer)) + "}";
}

}  // namespace tandem
