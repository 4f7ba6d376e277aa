#include "tasks/countdown_task.h"

#include <algorithm>
#include <stdexcept>

#include "tasks/answer_extraction.h"
#include "tasks/expression.h"
#include "tasks/prompt_random.h"

namespace tandem {
namespace {

// A partial solution while a puzzle is built: its value and how it is written.
struct Term {
  int64_t value;
  std::string text;
  int precedence;  // 3 for a number, 2 for * and /, 1 for + and -
};

int precedence_of(char op) { return op == '+' || op == '-' ? 1 : 2; }

std::string operand(const Term& term, char op, bool right) {
  // Parenthesise a weaker operand, and an equal one on the right of - or /, where
  // left-to-right evaluation would otherwise change the meaning.
  const bool wrap = term.precedence < precedence_of(op) ||
                    (right && term.precedence == precedence_of(op) && (op == '-' || op == '/'));
  return wrap ? "(" + term.text + ")" : term.text;
}

// a op b when it is a positive integer that fits, as in the Countdown game.
std::optional<int64_t> apply(char op, int64_t a, int64_t b) {
  int64_t result = 0;
  switch (op) {
    case '+': if (__builtin_add_overflow(a, b, &result)) return std::nullopt; break;
    case '-': result = a - b; break;
    case '*': if (__builtin_mul_overflow(a, b, &result)) return std::nullopt; break;
    default:
      if (a % b != 0) return std::nullopt;
      result = a / b;
  }
  if (result <= 0) return std::nullopt;
  return result;
}

struct Puzzle {
  std::vector<int64_t> numbers;  // in the order the prompt shows them
  std::string solution;
  int64_t target;
};

// Numbers and a random combination of all of them; nullopt when the result misses the range.
std::optional<Puzzle> try_puzzle(const CountdownSettings& settings, PromptRandom& random) {
  Puzzle puzzle;
  std::vector<Term> terms;
  for (int i = 0; i < settings.numbers; ++i) {
    const int64_t number = random.uniform(1, settings.max_number);
    puzzle.numbers.push_back(number);
    terms.push_back({number, std::to_string(number), 3});
  }
  static constexpr char kOps[] = {'+', '-', '*', '/'};
  while (terms.size() > 1) {
    const auto i = static_cast<size_t>(random.uniform(0, static_cast<int64_t>(terms.size()) - 1));
    auto j = static_cast<size_t>(random.uniform(0, static_cast<int64_t>(terms.size()) - 2));
    if (j >= i) ++j;
    // Try the operators from a random one onward; + always works for positive terms.
    const auto first = random.uniform(0, 3);
    std::optional<Term> combined;
    for (int k = 0; k < 4 && !combined; ++k) {
      const char op = kOps[(first + k) % 4];
      if (const auto value = apply(op, terms[i].value, terms[j].value))
        combined = Term{*value, operand(terms[i], op, false) + op + operand(terms[j], op, true), precedence_of(op)};
    }
    if (!combined) return std::nullopt;  // only when + overflows
    terms[std::min(i, j)] = std::move(*combined);
    terms.erase(terms.begin() + static_cast<std::ptrdiff_t>(std::max(i, j)));
  }
  if (terms[0].value > settings.max_target) return std::nullopt;
  puzzle.solution = terms[0].text;
  puzzle.target = terms[0].value;
  return puzzle;
}

std::string joined(const std::vector<int64_t>& numbers, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < numbers.size(); ++i) text += (i ? separator : "") + std::to_string(numbers[i]);
  return text;
}

}  // namespace

CountdownTask::CountdownTask(CountdownSettings settings) : settings_(std::move(settings)) {
  if (settings_.numbers < 2 || settings_.numbers > 6)
    throw std::invalid_argument("countdown task: numbers must be 2 to 6, got " + std::to_string(settings_.numbers));
  if (settings_.max_number < 1 || settings_.max_number > 1000000)
    throw std::invalid_argument("countdown task: max_number must be 1 to 1000000, got " +
                                std::to_string(settings_.max_number));
  if (settings_.max_target < 1)
    throw std::invalid_argument("countdown task: max_target must be at least 1, got " +
                                std::to_string(settings_.max_target));
}

Prompt CountdownTask::sample(uint64_t index) const {
  PromptRandom random(settings_.seed, index);
  // Each attempt draws new numbers; a random combination lands in [1, max_target] often
  // enough that the limit is only reached by settings that leave almost no such target.
  constexpr int kAttempts = 10000;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const std::optional<Puzzle> puzzle = try_puzzle(settings_, random);
    if (!puzzle) continue;
    Prompt prompt;
    prompt.index = index;
    prompt.answer = puzzle->solution;
    const std::string target = std::to_string(puzzle->target);
    if (settings_.style == PromptStyle::Compact) {
      prompt.text = joined(puzzle->numbers, ",") + ";" + target + "=";
    } else {
      prompt.text = "Using the numbers " + joined(puzzle->numbers, ", ") + ", write an expression that equals " +
                    target +
                    ". Use +, -, * and / with parentheses as needed, and each number at most once. Give only "
                    "the expression inside <answer></answer>, for example <answer>(1 + 2) * 3</answer>.";
    }
    return prompt;
  }
  throw std::runtime_error("countdown task: no puzzle with a target in [1, " + std::to_string(settings_.max_target) +
                           "] found for prompt " + std::to_string(index) + " after " + std::to_string(kAttempts) +
                           " attempts; raise max_target or lower max_number");
}

RewardBreakdown CountdownTask::judge(const Prompt& prompt, std::string_view completion) const {
  const ExpressionValue reference = evaluate_expression(prompt.answer);
  if (!reference.syntax_error.empty() || !reference.value || reference.value->denominator != 1)
    throw std::invalid_argument("countdown task: the reference answer '" + prompt.answer + "' of prompt " +
                                std::to_string(prompt.index) + " is not a solution with an integer value");
  const RewardWeights& weights = settings_.weights;

  std::string_view answer = completion;
  if (settings_.style == PromptStyle::Instruct) {
    const auto tagged = last_tagged(completion, "<answer>", "</answer>");
    if (!tagged) return weighted_reward(weights, false, false, "no <answer>...</answer>");
    answer = *tagged;
  }
  const ExpressionValue given = evaluate_expression(trim_ascii(answer));
  if (!given.syntax_error.empty())
    return weighted_reward(weights, false, false, "not an expression: " + given.syntax_error);

  std::vector<int64_t> available = reference.numbers;
  for (const int64_t number : given.numbers) {
    const auto found = std::find(available.begin(), available.end(), number);
    if (found == available.end()) {
      const bool given_at_all = std::count(reference.numbers.begin(), reference.numbers.end(), number) > 0;
      const char* why = given_at_all ? " is used more often than given" : " is not given";
      return weighted_reward(weights, true, false, std::to_string(number) + why);
    }
    available.erase(found);
  }
  if (!given.value) return weighted_reward(weights, true, false, given.arithmetic_error);
  if (*given.value != *reference.value) {
    const Rational& value = *given.value;
    const std::string shown = std::to_string(value.numerator) +
                              (value.denominator == 1 ? "" : "/" + std::to_string(value.denominator));
    return weighted_reward(weights, true, false,
                           "equals " + shown + ", not " + std::to_string(reference.value->numerator));
  }
  return weighted_reward(weights, true, true);
}

std::string CountdownTask::reference_completion(const Prompt& prompt) const {
  return settings_.style == PromptStyle::Instruct ? "<answer>" + prompt.answer + "</answer>" : prompt.answer;
}

std::string CountdownTask::alphabet() const {
  if (settings_.style == PromptStyle::Instruct) return {};
  return "0123456789+-*/(),;=";
}

}  // namespace tandem
