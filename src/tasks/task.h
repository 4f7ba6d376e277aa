// A verifiable task: it makes prompts from a seed and scores what the policy wrote.
//
// sample(index) depends on nothing but the task's settings (seed included) and the index,
// so every rank, a resumed run and a test see the same prompt for the same index. Both
// calls are const and keep no state: rollout threads may call them at once.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

struct Prompt {
  uint64_t index = 0;
  std::string text;    // what the model is asked, before any chat template
  std::string answer;  // the reference answer the reward checks against
};

// How much each part of a reward is worth; total = format * format + correct * correct.
struct RewardWeights {
  double format = 0.1;
  double correct = 0.9;
};

struct RewardBreakdown {
  double format = 0;   // 1 when the answer has the expected form, else 0
  double correct = 0;  // 1 when it is right, else 0 (a right answer always has the form)
  double total = 0;    // the weighted sum: the reward
  std::string note;    // why it lost points, for logs and samples; empty when correct
};

// How a generated task words its prompts. Compact: terse text for a model trained from
// scratch with a character tokenizer ("12+34=" -> "46"); the completion is the bare answer.
// Instruct: a sentence for a pretrained chat model, which answers inside <answer></answer>.
enum class PromptStyle { Compact, Instruct };

RewardBreakdown weighted_reward(const RewardWeights& weights, bool format, bool correct, std::string note = {});

class Task {
 public:
  virtual ~Task() = default;

  virtual Prompt sample(uint64_t index) const = 0;

  // Scores a completion: the text the policy generated after the prompt, stop token excluded.
  virtual RewardBreakdown judge(const Prompt& prompt, std::string_view completion) const = 0;

  double reward(const Prompt& prompt, std::string_view completion) const { return judge(prompt, completion).total; }

  // A right completion written as the prompt asks for it (the bare answer, or the answer
  // in its tags): the target of the supervised warm-up.
  virtual std::string reference_completion(const Prompt& prompt) const = 0;

  // Every character a prompt or a right completion can contain, for a character tokenizer;
  // empty when the text is free-form and needs a pretrained model's tokenizer.
  virtual std::string alphabet() const = 0;
};

}  // namespace tandem
