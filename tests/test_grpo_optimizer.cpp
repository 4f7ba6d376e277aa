// Around the optimizer step: gradient-norm clipping and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train/gradient_clipping.h"
#include "train/lr_schedule.h"

namespace tandem {
namespace {

TEST(GradientClipping, GlobalNormOverSlabsAndScaleToMaxNorm) {
  std::vector<float> a = {3, 0, 0}, b = {0, 4};  // global norm 5
  const std::vector<std::span<float>> slabs = {a, b};
  EXPECT_DOUBLE_EQ(gradient_square_sum(slabs), 25);
  EXPECT_DOUBLE_EQ(clip_gradient_norm(slabs, 1.0), 5);
  const double factor = 1.0 / (5 + 1e-6);  // torch's clip_coef
  EXPECT_FLOAT_EQ(a[0], static_cast<float>(3 * factor));
  EXPECT_FLOAT_EQ(b[1], static_cast<float>(4 * factor));
  EXPECT_NEAR(std::sqrt(gradient_square_sum(slabs)), 1.0, 1e-6);
}

TEST(GradientClipping, BelowTheLimitNothingChanges) {
  std::vector<float> a = {0.3f, -0.4f};
  const std::vector<std::span<float>> slabs = {a};
  EXPECT_NEAR(clip_gradient_norm(slabs, 1.0), 0.5, 1e-7);
  EXPECT_EQ(a, (std::vector<float>{0.3f, -0.4f}));
}

TEST(GradientClipping, LargeSlabsSumInDouble) {
  // 2^20 elements of 1e-3: a float accumulator would drift; the norm is exactly 1.024.
  std::vector<float> big(1 << 20, 1e-3f);
  const std::vector<std::span<float>> slabs = {big};
  EXPECT_NEAR(std::sqrt(gradient_square_sum(slabs)), std::sqrt((1 << 20) * 1e-6), 1e-6);
}

TEST(GradientClipping, ANonFiniteNormLeavesGradientsForTheCallerToSkip) {
  std::vector<float> a = {1, std::numeric_limits<float>::infinity()};
  const std::vector<std::span<float>> slabs = {a};
  EXPECT_TRUE(std::isinf(clip_gradient_norm(slabs, 1.0)));
  EXPECT_EQ(a[0], 1);
  EXPECT_EQ(clip_scale(std::nan(""), 1.0), 1);
  EXPECT_THROW(clip_scale(1.0, 0), std::invalid_argument);
}

TEST(LrSchedule, LinearWarmupThenCosineToTheFloor) {
  const LrSchedule schedule(1e-3, 1e-4, 10, 110);
  EXPECT_DOUBLE_EQ(schedule.at(1), 1e-4);
  EXPECT_DOUBLE_EQ(schedule.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1e-3);
  EXPECT_NEAR(schedule.at(60), 0.5 * (1e-3 + 1e-4), 1e-15);  // halfway through the decay
  EXPECT_NEAR(schedule.at(35), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(schedule.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(schedule.at(500), 1e-4);
  for (int64_t step = 11; step < 110; ++step) EXPECT_LT(schedule.at(step + 1), schedule.at(step)) << step;
}

TEST(LrSchedule, WithoutWarmupItStartsDecaying) {
  const LrSchedule schedule(2.0, 0.0, 0, 4);
  EXPECT_NEAR(schedule.at(1), 1 + std::cos(M_PI / 4), 1e-12);
  EXPECT_NEAR(schedule.at(2), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(schedule.at(4), 0.0);
}

TEST(LrSchedule, RefusesBadSettings) {
  EXPECT_THROW(LrSchedule(1e-3, 2e-3, 0, 10), std::invalid_argument);
  EXPECT_THROW(LrSchedule(1e-3, -1, 0, 10), std::invalid_argument);
  EXPECT_THROW(LrSchedule(1e-3, 0, 11, 10), std::invalid_argument);
  EXPECT_THROW(LrSchedule(1e-3, 0, 0, 0), std::invalid_argument);
  EXPECT_THROW(LrSchedule(1e-3, 0, 0, 10).at(0), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
