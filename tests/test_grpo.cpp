// Group-normalised advantages and dynamic sampling.
#include <gtest/gtest.h>

#include <cmath>

#include "driver/sampled_group.h"
#include "train/advantages.h"
#include "train/dynamic_sampling.h"

namespace tandem {
namespace {

TEST(GrpoAdvantages, MeanSubtractedAndDividedByTheBesselStdPlusTheFloor) {
  const std::vector<double> rewards = {1, 0, 0, 1, 0.5, 0.2, 0.2, 0.9};
  const std::vector<float> a = group_advantages(rewards, 4, {.scale_by_std = true, .std_floor = 1e-6});
  // Group 1: mean 0.5, Bessel std sqrt(4 * 0.25 / 3).
  const double std1 = std::sqrt(1.0 / 3.0);
  EXPECT_NEAR(a[0], 0.5 / (std1 + 1e-6), 1e-6);
  EXPECT_NEAR(a[1], -0.5 / (std1 + 1e-6), 1e-6);
  // Group 2 on its own: mean 0.45.
  const double mean2 = 0.45;
  const double std2 = std::sqrt((0.05 * 0.05 + 0.25 * 0.25 * 2 + 0.45 * 0.45) / 3);
  EXPECT_NEAR(a[4], (0.5 - mean2) / (std2 + 1e-6), 1e-6);
  EXPECT_NEAR(a[7], (0.9 - mean2) / (std2 + 1e-6), 1e-6);
  double sum = 0;
  for (int i = 4; i < 8; ++i) sum += a[i];
  EXPECT_NEAR(sum, 0, 1e-6);
}

TEST(GrpoAdvantages, DrGrpoOnlySubtractsTheMean) {
  const std::vector<float> a = group_advantages(std::vector<double>{1, 0, 0, 1, 0.5, 0.2}, 3, {.scale_by_std = false});
  EXPECT_NEAR(a[0], 2.0 / 3, 1e-7);
  EXPECT_NEAR(a[1], -1.0 / 3, 1e-7);
  EXPECT_NEAR(a[3], 1.0 - 1.7 / 3, 1e-7);
  EXPECT_NEAR(a[5], 0.2 - 1.7 / 3, 1e-7);
}

TEST(GrpoAdvantages, TheFloorBoundsATinySpread) {
  const std::vector<double> rewards = {0.5, 0.5 + 1e-9};
  const std::vector<float> floored = group_advantages(rewards, 2, {.std_floor = 1e-4});
  EXPECT_LT(std::fabs(floored[1]), 1e-5);  // 5e-10 / (7e-10 + 1e-4)
  const std::vector<float> unfloored = group_advantages(rewards, 2, {.std_floor = 0});
  EXPECT_NEAR(unfloored[1], 1 / std::sqrt(2.0), 1e-3);
}

TEST(GrpoAdvantages, SingletonAndFlatGroupsGetExactlyZero) {
  for (const bool scale : {true, false}) {
    const std::vector<float> singles = group_advantages(std::vector<double>{1, 0, 0.3}, 1, {.scale_by_std = scale});
    EXPECT_EQ(singles, (std::vector<float>{0, 0, 0}));
    // 0.1 three times: the rounded mean is not 0.1, yet the advantages are exactly 0.
    const std::vector<float> flat = group_advantages(std::vector<double>{0.1, 0.1, 0.1, 1, 0, 1}, 3,
                                                     {.scale_by_std = scale});
    EXPECT_EQ(flat[0], 0.0f);
    EXPECT_EQ(flat[1], 0.0f);
    EXPECT_EQ(flat[2], 0.0f);
    EXPECT_NE(flat[3], 0.0f);
  }
}

TEST(GrpoAdvantages, RefusesRaggedGroups) {
  EXPECT_THROW(group_advantages(std::vector<double>{1, 2, 3}, 2, {}), std::invalid_argument);
  EXPECT_THROW(group_advantages(std::vector<double>{1, 2}, 0, {}), std::invalid_argument);
  EXPECT_THROW(group_advantages(std::vector<double>{1, 2}, 2, {.std_floor = -1}), std::invalid_argument);
  EXPECT_TRUE(group_advantages(std::vector<double>{}, 4, {}).empty());
}

TEST(GrpoAdvantages, RewardStd) {
  EXPECT_EQ(reward_std(std::vector<double>{3}), 0);
  EXPECT_EQ(reward_std(std::vector<double>{}), 0);
  EXPECT_NEAR(reward_std(std::vector<double>{1, 2, 3, 4}), std::sqrt(5.0 / 3.0), 1e-12);
}

TEST(DynamicSampling, DropsFlatGroupsAndOverSamplesUntilTheBatchIsFull) {
  DynamicSampling sampling({.batch_groups = 3, .group_size = 2, .over_sampling_groups = 4, .max_rounds = 5});
  EXPECT_EQ(sampling.groups_to_sample(), 4);
  // Round 1: groups 1 and 3 have a spread.
  EXPECT_EQ(sampling.offer(std::vector<double>{1, 1, 0, 1, 0, 0, 1, 0}), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(sampling.kept(), 2);
  EXPECT_EQ(sampling.dropped_flat(), 2);
  EXPECT_FALSE(sampling.full());
  EXPECT_EQ(sampling.groups_to_sample(), 4);  // one missing, but a round is at least the over-sampling size
  // Round 2: the first spread group fills the batch; the next ones are surplus.
  EXPECT_EQ(sampling.offer(std::vector<double>{0, 1, 1, 0, 1, 1, 0, 1}), (std::vector<int64_t>{0}));
  EXPECT_TRUE(sampling.full());
  EXPECT_EQ(sampling.surplus(), 2);
  EXPECT_EQ(sampling.dropped_flat(), 3);
  EXPECT_EQ(sampling.rounds(), 2);
  EXPECT_EQ(sampling.groups_to_sample(), 0);
}

// The decision of a round with over-sampling: through the group that fills the batch, and
// only from complete leading groups (a prefix of the round's rewards).
TEST(DynamicSampling, TheLeadingGroupsThatFillTheBatchDecideIt) {
  DynamicSampling sampling({.batch_groups = 3, .group_size = 2, .over_sampling_groups = 8});
  EXPECT_EQ(sampling.offer(std::vector<double>{0, 1}), (std::vector<int64_t>{0}));
  const BatchDecision spread = sampling.next_decision(true);
  EXPECT_EQ(spread.needed, 2);
  const std::vector<double> round = {1, 1, 0, 1, 0, 0, 1, 0, 0, 1};  // spread at 1, 3, 4
  EXPECT_EQ(spread.decided_by(round), 4);
  EXPECT_EQ(spread.decided_by(std::span(round).first(6)), 0);  // groups 0-2: one spread, undecided
  EXPECT_EQ(spread.decided_by(std::span(round).first(8)), 4);
  const BatchDecision any = sampling.next_decision(false);  // SFT steps: every group counts
  EXPECT_EQ(any.decided_by(round), 2);
  EXPECT_EQ(BatchDecision{}.decided_by(round), 0);  // no over-sampling: never decided early
}

TEST(DynamicSampling, AskForTheMissingGroupsWhenThatIsMoreThanTheOverSampling) {
  DynamicSampling sampling({.batch_groups = 10, .group_size = 2, .over_sampling_groups = 4});
  EXPECT_EQ(sampling.groups_to_sample(), 10);
}

TEST(DynamicSampling, GivesUpAfterMaxRounds) {
  DynamicSampling sampling({.batch_groups = 2, .group_size = 3, .over_sampling_groups = 2, .max_rounds = 2});
  const std::vector<double> flat = {1, 1, 1, 0, 0, 0};
  EXPECT_TRUE(sampling.offer(flat).empty());
  EXPECT_EQ(sampling.groups_to_sample(), 2);
  EXPECT_TRUE(sampling.offer(flat).empty());
  EXPECT_EQ(sampling.groups_to_sample(), 0);
  EXPECT_FALSE(sampling.full());
  EXPECT_EQ(sampling.dropped_flat(), 4);
}

TEST(DynamicSampling, SpreadMeansAStdAboveMinStd) {
  DynamicSampling sampling({.batch_groups = 4, .group_size = 2, .min_std = 0.1});
  // std of {0, 0.1} is 0.0707; of {0, 0.2} 0.141.
  EXPECT_EQ(sampling.offer(std::vector<double>{0, 0.1, 0, 0.2}), (std::vector<int64_t>{1}));
}

TEST(DynamicSampling, RefusesBadSettingsAndRaggedRounds) {
  EXPECT_THROW(DynamicSampling({.batch_groups = 0}), std::invalid_argument);
  EXPECT_THROW(DynamicSampling({.group_size = 0}), std::invalid_argument);
  EXPECT_THROW(DynamicSampling({.over_sampling_groups = 0}), std::invalid_argument);
  EXPECT_THROW(DynamicSampling({.max_rounds = 0}), std::invalid_argument);
  EXPECT_THROW(DynamicSampling({.min_std = -1}), std::invalid_argument);
  DynamicSampling sampling({.group_size = 2});
  EXPECT_THROW(sampling.offer(std::vector<double>{1, 2, 3}), std::invalid_argument);
}

TEST(GrpoSampledGroups, BytesReadBackToTheSameGroups) {
  SampledGroup group;
  group.prompt_index = 12345678901ull;
  group.prompt = {151644, 872, 198};
  group.prompt_text = "<|im_start|>user\n\xe4\xbd\xa0";  // any bytes, not only ASCII
  group.samples.push_back({{5, 6, 151645}, {-0.25f, -1.5f, -3.0f}, "56", 0.9});
  group.samples.push_back({{7}, {-0.125f}, "", 0.0});
  const std::vector<SampledGroup> groups = {group, SampledGroup{}, group};
  const std::string bytes = write_groups(groups);
  EXPECT_EQ(read_groups(bytes), groups);
  EXPECT_TRUE(read_groups(write_groups({})).empty());
  EXPECT_EQ(group.rewards(), (std::vector<double>{0.9, 0.0}));
  EXPECT_THROW(read_groups(std::string_view(bytes).substr(0, bytes.size() - 1)), std::runtime_error);
  EXPECT_THROW(read_groups(bytes + "x"), std::runtime_error);
}

}  // namespace
}  // namespace tandem
