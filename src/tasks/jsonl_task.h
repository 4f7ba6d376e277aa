// Prompts from a JSONL file, one {"prompt": "...", "answer": ...} object a line, with a
// configurable rule for what counts as the right answer.
#pragma once
#include <filesystem>
#include <string_view>
#include <vector>

#include "tasks/task.h"

namespace tandem {

enum class AnswerMatch {
  Exact,       // the trimmed completion equals the trimmed answer
  LastNumber,  // the last number of the completion equals the last number of the answer
  Boxed,       // the last \boxed{...} equals the answer (or the answer's own \boxed{...})
};

// "exact", "last-number", "boxed" (the deck's task.reward); throws std::invalid_argument
// listing them.
AnswerMatch answer_match_from_name(std::string_view name);

struct JsonlTaskSettings {
  std::filesystem::path path;
  AnswerMatch match = AnswerMatch::Exact;
  uint64_t seed = 0;  // the order of the lines in each epoch
  RewardWeights weights;
};

class JsonlTask final : public Task {
 public:
  // Reads the whole file. Throws std::runtime_error "<path>:<line>: <reason>" for a line
  // that is not a JSON object with a string "prompt" and a string or number "answer" (and,
  // for last-number, an answer with a number in it). Blank lines are skipped.
  explicit JsonlTask(JsonlTaskSettings settings);

  size_t size() const { return records_.size(); }

  // Index i is position i % size() in a shuffle of all lines that is new each epoch
  // (i / size()), so every epoch visits every line once.
  Prompt sample(uint64_t index) const override;
  // Format: exact - the completion is not blank; last-number - it has a number; boxed -
  // it has a closed \boxed{...}. Boxed answers match as text with spaces removed, or as
  // numbers of equal value.
  RewardBreakdown judge(const Prompt& prompt, std::string_view completion) const override;
  // boxed: the answer inside \boxed{}; otherwise the answer as the file gives it.
  std::string reference_completion(const Prompt& prompt) const override;
  std::string alphabet() const override { return {}; }

 private:
  struct Record {
    std::string prompt;
    std::string answer;
  };
  JsonlTaskSettings settings_;
  std::vector<Record> records_;
};

}  // namespace tandem
