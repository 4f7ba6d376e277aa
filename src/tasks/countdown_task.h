// Countdown: reach a target from given numbers with + - * / and parentheses, each number
// used at most once. "3,5,7;26=" -> "3*7+5".
//
// The reference answer is a solution that uses every given number, so the puzzle travels
// with the prompt: the numbers are its literals and the target its value. Division is exact
// over the rationals (intermediate fractions are allowed, as in Python-eval graders), so
// "7/2*2" is 7 and "7/2" is not 3.
#pragma once
#include "tasks/task.h"

namespace tandem {

struct CountdownSettings {
  uint64_t seed = 0;
  int numbers = 3;           // how many numbers each puzzle gives, 2 to 6
  int64_t max_number = 99;   // numbers are drawn from [1, max_number]
  int64_t max_target = 100;  // targets lie in [1, max_target]
  PromptStyle style = PromptStyle::Compact;
  RewardWeights weights;
};

class CountdownTask final : public Task {
 public:
  // Throws std::invalid_argument naming a setting out of range.
  explicit CountdownTask(CountdownSettings settings);

  Prompt sample(uint64_t index) const override;
  // Format: the answer parses as an expression. Correct: it uses only given numbers, none
  // more often than given, evaluates without dividing by zero, and equals the target.
  RewardBreakdown judge(const Prompt& prompt, std::string_view completion) const override;
  // Instruct: the answer inside <answer></answer>.
  std::string reference_completion(const Prompt& prompt) const override;
  std::string alphabet() const override;

 private:
  CountdownSettings settings_;
};

}  // namespace tandem
