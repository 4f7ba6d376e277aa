#include "train/advantages.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem {

double reward_std(std::span<const double> rewards) {
  if (rewards.size() < 2) return 0;
  double mean = 0;
  for (const double r : rewards) mean += r;
  mean /= static_cast<double>(rewards.size());
  double squares = 0;
  for (const double r : rewards) squares += (r - mean) * (r - mean);
  return std::sqrt(squares / static_cast<double>(rewards.size() - 1));
}

std::vector<float> group_advantages(std::span<const double> rewards, int64_t group_size,
                                    const AdvantageSettings& settings) {
  if (group_size < 1 || rewards.size() % static_cast<size_t>(group_size) != 0)
    throw std::invalid_argument("group_advantages: " + std::to_string(rewards.size()) +
                                " rewards do not make groups of " + std::to_string(group_size));
  if (!(settings.std_floor >= 0))
    throw std::invalid_argument("group_advantages: std_floor must be >= 0, got " + std::to_string(settings.std_floor));
  std::vector<float> advantages(rewards.size());
  for (size_t start = 0; start < rewards.size(); start += static_cast<size_t>(group_size)) {
    const std::span<const double> group = rewards.subspan(start, static_cast<size_t>(group_size));
    // Equal rewards give exactly 0: their rounded mean need not equal them.
    const auto [low, high] = std::minmax_element(group.begin(), group.end());
    if (*low == *high) continue;
    double mean = 0;
    for (const double r : group) mean += r;
    mean /= static_cast<double>(group_size);
    const double scale = settings.scale_by_std ? 1 / (reward_std(group) + settings.std_floor) : 1;
    for (size_t i = 0; i < group.size(); ++i)
      advantages[start + i] = static_cast<float>((group[i] - mean) * scale);
  }
  return advantages;
}

}  // namespace tandem
