// Group-normalised advantages (GRPO): each sample's reward against the other samples for
// the same prompt. Convention (verl's, also miles'): A = (r - mean) / (std + floor), with
// the Bessel-corrected std of the group; scale_by_std = false gives Dr. GRPO's A = r - mean.
// A group of one has no baseline and gets A = 0 (verl would give it r / (1 + floor)), and a
// group whose rewards are all equal gets A = 0 in both modes.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

struct AdvantageSettings {
  bool scale_by_std = true;
  double std_floor = 1e-6;  // added to the std, so a tiny spread cannot blow the advantages up
};

// rewards: consecutive groups of group_size samples of one prompt each. Throws
// std::invalid_argument when the count is not a multiple of group_size.
std::vector<float> group_advantages(std::span<const double> rewards, int64_t group_size,
                                    const AdvantageSettings& settings);

// The Bessel-corrected standard deviation (0 for fewer than two values).
double reward_std(std::span<const double> rewards);

}  // namespace tandem
