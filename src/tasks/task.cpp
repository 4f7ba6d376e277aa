#include "tasks/task.h"

namespace tandem {

RewardBreakdown weighted_reward(const RewardWeights& weights, bool format, bool correct, std::string note) {
  RewardBreakdown reward;
  reward.format = format ? 1 : 0;
  reward.correct = correct ? 1 : 0;
  reward.total = weights.format * reward.format + weights.correct * reward.correct;
  reward.note = std::move(note);
  return reward;
}

}  // namespace tandem
