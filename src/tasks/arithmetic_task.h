// Multi-digit integer arithmetic with an exact answer: "12+34=" -> "46".
#pragma once
#include "tasks/task.h"

namespace tandem {

struct ArithmeticSettings {
  uint64_t seed = 0;
  int digits = 2;                 // operands are drawn uniformly from [0, 10^digits)
  std::string operations = "+-*";  // a non-empty subset of "+-*"
  PromptStyle style = PromptStyle::Compact;
  RewardWeights weights;
};

class ArithmeticTask final : public Task {
 public:
  // Throws std::invalid_argument naming a setting out of range (digits 1 to 9).
  explicit ArithmeticTask(ArithmeticSettings settings);

  Prompt sample(uint64_t index) const override;
  // Format: the answer is an integer ("-7", "408"); correct: it is the reference, exactly
  // (so "046" is well-formed but wrong).
  RewardBreakdown judge(const Prompt& prompt, std::string_view completion) const override;
  // Instruct: the answer inside <answer></answer>.
  std::string reference_completion(const Prompt& prompt) const override;
  std::string alphabet() const override;

 private:
  ArithmeticSettings settings_;
};

}  // namespace tandem
