#include "train/dynamic_sampling.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "train/advantages.h"

namespace tandem {

bool has_reward_spread(std::span<const double> group_rewards, double min_std) { return reward_std(group_rewards) > min_std; }

int64_t BatchDecision::decided_by(std::span<const double> rewards) const {
  if (needed <= 0) return 0;
  const auto size = static_cast<size_t>(group_size);
  int64_t counted = 0;
  for (size_t start = 0; start + size <= rewards.size(); start += size)
    if ((!spread_only || has_reward_spread(rewards.subspan(start, size), min_std)) && ++counted == needed)
      return static_cast<int64_t>(start / size) + 1;
  return 0;
}

DynamicSampling::DynamicSampling(const DynamicSamplingSettings& settings) : settings_(settings) {
  const auto require_positive = [](int64_t value, const char* name) {
    if (value < 1)
      throw std::invalid_argument(std::string("dynamic sampling: ") + name + " must be at least 1, got " +
                                  std::to_string(value));
  };
  require_positive(settings.batch_groups, "batch_groups");
  require_positive(settings.group_size, "group_size");
  require_positive(settings.over_sampling_groups, "over_sampling_groups");
  require_positive(settings.max_rounds, "max_rounds");
  if (!(settings.min_std >= 0))
    throw std::invalid_argument("dynamic sampling: min_std must be >= 0, got " + std::to_string(settings.min_std));
}

int64_t DynamicSampling::groups_to_sample() const {
  if (full() || rounds_ >= settings_.max_rounds) return 0;
  return std::max(settings_.batch_groups - kept_, settings_.over_sampling_groups);
}

std::vector<int64_t> DynamicSampling::offer(std::span<const double> rewards) {
  const auto group_size = static_cast<size_t>(settings_.group_size);
  if (rewards.size() % group_size != 0)
    throw std::invalid_argument("dynamic sampling: " + std::to_string(rewards.size()) +
                                " rewards do not make groups of " + std::to_string(group_size));
  ++rounds_;
  std::vector<int64_t> kept;
  for (size_t start = 0; start < rewards.size(); start += group_size) {
    if (!has_reward_spread(rewards.subspan(start, group_size), settings_.min_std)) {
      ++dropped_flat_;
    } else if (full()) {
      ++surplus_;
    } else {
      kept.push_back(static_cast<int64_t>(start / group_size));
      ++kept_;
    }
  }
  return kept;
}

}  // namespace tandem
