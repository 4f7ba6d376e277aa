// Dynamic sampling (DAPO): a group whose rewards are all equal has zero advantages and
// teaches nothing, so it is dropped, and prompts are drawn in rounds of over-sampling
// until the batch holds enough groups with a spread (miles' check_reward_nonzero_std).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// When a round's leading groups decide the step's batch: once they hold, in prompt order,
// `needed` groups that count (those with a reward spread when spread_only, else every
// one), the groups after the one that fills the batch cannot change it, so a round with
// over-sampling ends there and aborts the requests still in flight.
struct BatchDecision {
  int64_t needed = 0;  // 0: the round is never decided early, it is drawn whole
  int64_t group_size = 1;
  bool spread_only = false;
  double min_std = 1e-8;

  // How many leading groups decide the batch, given the rewards of a run of complete
  // leading groups (group_size each, in prompt order); 0 while they do not decide it.
  int64_t decided_by(std::span<const double> rewards) const;
};

// Whether a group's rewards differ: its reward std exceeds min_std.
bool has_reward_spread(std::span<const double> group_rewards, double min_std);

struct DynamicSamplingSettings {
  int64_t batch_groups = 1;          // groups (prompts) one training step wants
  int64_t group_size = 1;            // samples per prompt
  int64_t over_sampling_groups = 1;  // prompts drawn per round at least
  int64_t max_rounds = 8;            // then the step trains on what it has
  double min_std = 1e-8;             // a group counts as spread when its reward std exceeds this
};

class DynamicSampling {
 public:
  // Throws std::invalid_argument naming a setting below 1 (or a negative min_std).
  explicit DynamicSampling(const DynamicSamplingSettings& settings);

  // How many prompts to draw next: 0 once the batch is full or max_rounds have been
  // drawn, else the larger of the missing groups and over_sampling_groups.
  int64_t groups_to_sample() const;

  // Takes one round's scored groups (group_size consecutive rewards each) and returns the
  // positions, within this round, of the groups kept for the batch: those with a spread,
  // in order, until the batch is full. The rest are dropped (flat) or surplus.
  std::vector<int64_t> offer(std::span<const double> rewards);

  // The decision of the next round: the groups still missing from the batch.
  BatchDecision next_decision(bool spread_only) const {
    return {settings_.batch_groups - kept_, settings_.group_size, spread_only, settings_.min_std};
  }

  bool full() const { return kept_ == settings_.batch_groups; }
  int64_t kept() const { return kept_; }
  int64_t dropped_flat() const { return dropped_flat_; }  // zero spread
  int64_t surplus() const { return surplus_; }            // had a spread, arrived after the batch was full
  int64_t rounds() const { return rounds_; }

 private:
  DynamicSamplingSettings settings_;
  int64_t kept_ = 0, dropped_flat_ = 0, surplus_ = 0, rounds_ = 0;
};

}  // namespace tandem
