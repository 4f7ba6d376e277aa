// The clipped-ratio policy loss: a hand-worked case, a double-precision reference for each
// aggregation mode with clipping on both sides, KL and entropy terms, and d(loss)/d(logp)
// and d(loss)/d(entropy) by finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>

#include "train/policy_loss.h"

namespace tandem {
namespace {

TEST(GrpoLoss, HandWorkedTokenMean) {
  // Ratios 1.5, 0.5, 1, 0.5, 1.5 with advantages 1, -1, 2, 1, -1 and eps 0.2:
  //   A>0, ratio 1.5 > 1.2: clipped, pg = -1.2, no gradient
  //   A<0, ratio 0.5 < 0.8: clipped, pg = max(0.5, 0.8) = 0.8, no gradient
  //   A=2, ratio 1: pg = -2, dpg/dlogp = -A*ratio = -2
  //   A>0, ratio 0.5: the unclipped term is larger, pg = -0.5, gradient -0.5
  //   A<0, ratio 1.5: pg = max(1.5, 1.2) = 1.5, gradient +1.5
  const float l15 = std::log(1.5f), l05 = std::log(0.5f);
  const std::vector<float> logp = {l15, l05, 0, l05, l15}, old(5, 0.0f), adv = {1, -1, 2, 1, -1};
  const std::vector<uint8_t> mask(5, 1);
  const PolicyLoss r = policy_loss({.logp = logp, .old_logp = old, .advantages = adv, .mask = mask}, {});
  EXPECT_NEAR(r.loss, (-1.2 + 0.8 - 2 - 0.5 + 1.5) / 5, 1e-6);
  const std::vector<double> expected = {0, 0, -0.4, -0.1, 0.3};
  for (size_t t = 0; t < 5; ++t) EXPECT_NEAR(r.dlogp[t], expected[t], 1e-6) << t;
  EXPECT_NEAR(r.metrics.pg_loss, r.loss, 1e-12);
  EXPECT_DOUBLE_EQ(r.metrics.clip_fraction_high, 0.2);
  EXPECT_DOUBLE_EQ(r.metrics.clip_fraction_low, 0.2);
  EXPECT_NEAR(r.metrics.ratio_mean, 1.0, 1e-6);
  EXPECT_NEAR(r.metrics.ratio_max, 1.5, 1e-6);
  EXPECT_EQ(r.metrics.tokens, 5);
  EXPECT_TRUE(r.dentropy.empty());
}

TEST(GrpoLoss, HandWorkedKlEstimators) {
  // ref - logp = log 2: k1 = -log 2 (d/dlogp = 1), k3 = 2 - log 2 - 1 (d/dlogp = 1 - 2).
  const std::vector<float> logp = {-1}, old = {-1}, ref = {-1 + std::log(2.0f)}, adv = {0};
  const std::vector<uint8_t> mask = {1};
  const PolicyLossBatch batch{.logp = logp, .old_logp = old, .ref_logp = ref, .advantages = adv, .mask = mask};
  const PolicyLoss k3 = policy_loss(batch, {.kl_coef = 0.5, .kl_estimator = KlEstimator::K3});
  EXPECT_NEAR(k3.loss, 0.5 * (1 - std::log(2.0)), 1e-6);
  EXPECT_NEAR(k3.metrics.kl_mean, 1 - std::log(2.0), 1e-6);
  EXPECT_NEAR(k3.dlogp[0], 0.5 * (1 - 2), 1e-6);
  const PolicyLoss k1 = policy_loss(batch, {.kl_coef = 0.5, .kl_estimator = KlEstimator::K1});
  EXPECT_NEAR(k1.loss, -0.5 * std::log(2.0), 1e-6);
  EXPECT_NEAR(k1.dlogp[0], 0.5, 1e-6);
  // Given but not weighted: measured, not in the loss.
  const PolicyLoss measured = policy_loss(batch, {});
  EXPECT_NEAR(measured.metrics.kl_mean, 1 - std::log(2.0), 1e-6);
  EXPECT_EQ(measured.loss, 0);
}

// A packed micro-batch of four sequences: prompt tokens unmasked, one sequence with no
// completion tokens at all, ratios spread wide enough that both clip bounds bite.
struct Batch {
  std::vector<float> logp, old_logp, ref_logp, entropy, advantages;
  std::vector<uint8_t> mask;
  std::vector<int32_t> cu_seqlens = {0, 9, 20, 25, 40};
  double global_tokens = 0;

  Batch() {
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> log_ratio(-0.5f, 0.5f), noise(-0.3f, 0.3f), logp_value(-4.0f, -0.1f),
        h(0.1f, 3.0f);
    const std::vector<float> sequence_advantage = {1.2f, -0.8f, 0.5f, -1.5f};
    const std::vector<int> prompt_tokens = {3, 4, 5, 6};  // sequence 2 is all prompt
    for (int s = 0; s < 4; ++s) {
      for (int t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) {
        const float lp = logp_value(rng);
        float r = log_ratio(rng);
        // Keep every ratio 0.02 away from the clip bounds (0.8, 1.2, 1.28), where the loss
        // has kinks and finite differences mean nothing.
        for (const double bound : {0.8, 1.2, 1.28})
          if (std::fabs(std::exp(r) - bound) < 0.02) r += 0.05f;
        logp.push_back(lp);
        old_logp.push_back(lp - r);
        ref_logp.push_back(lp + noise(rng));
        entropy.push_back(h(rng));
        advantages.push_back(sequence_advantage[s]);
        mask.push_back(t - cu_seqlens[s] >= prompt_tokens[s]);
      }
    }
    // The caller's count over all ranks: this batch's 22 tokens and another rank's 28.
    global_tokens = 50;
  }
  PolicyLossBatch view() const {
    return {.logp = logp, .old_logp = old_logp, .ref_logp = ref_logp, .entropy = entropy, .advantages = advantages,
            .mask = mask, .cu_seqlens = cu_seqlens, .global_tokens = global_tokens};
  }
};

// The paper's form, token by token in double: -min(ratio*A, clip(ratio)*A) + beta*KL - c*H.
double reference_token_loss(const Batch& b, size_t t, const PolicyLossSettings& s) {
  const double ratio = std::exp(static_cast<double>(b.logp[t]) - b.old_logp[t]);
  const double a = b.advantages[t];
  const double surrogate = std::min(ratio * a, std::clamp(ratio, 1 - s.eps_low, 1 + s.eps_high) * a);
  const double d = static_cast<double>(b.ref_logp[t]) - b.logp[t];
  const double kl = s.kl_estimator == KlEstimator::K1 ? -d : std::exp(d) - d - 1;
  return -surrogate + s.kl_coef * kl - s.entropy_coef * b.entropy[t];
}

double reference_loss(const Batch& b, const PolicyLossSettings& s) {
  double total = 0;
  int64_t tokens = 0, sequences = 0;
  double sequence_means = 0;
  for (size_t q = 0; q + 1 < b.cu_seqlens.size(); ++q) {
    double sum = 0;
    int64_t count = 0;
    for (int32_t t = b.cu_seqlens[q]; t < b.cu_seqlens[q + 1]; ++t) {
      if (!b.mask[t]) continue;
      sum += reference_token_loss(b, t, s);
      ++count;
    }
    total += sum;
    tokens += count;
    if (count > 0) {
      sequence_means += sum / count;
      ++sequences;
    }
  }
  switch (s.aggregation) {
    case LossAggregation::TokenMean: return total / tokens;
    case LossAggregation::SeqMeanTokenMean: return sequence_means / sequences;
    case LossAggregation::GlobalTokenSum: return total / b.global_tokens;
  }
  return 0;
}

const LossAggregation kAggregations[] = {LossAggregation::TokenMean, LossAggregation::SeqMeanTokenMean,
                                         LossAggregation::GlobalTokenSum};

TEST(GrpoLoss, MatchesTheDoubleReferenceForEveryAggregation) {
  const Batch b;
  for (const LossAggregation aggregation : kAggregations) {
    for (const KlEstimator kl : {KlEstimator::K1, KlEstimator::K3}) {
      const PolicyLossSettings s{.eps_low = 0.2, .eps_high = 0.28, .aggregation = aggregation, .kl_coef = 0.05,
                                 .kl_estimator = kl, .entropy_coef = 0.01};
      const PolicyLoss r = policy_loss(b.view(), s);
      EXPECT_NEAR(r.loss, reference_loss(b, s), 1e-9) << static_cast<int>(aggregation);
      // Clipping active on both sides, so the comparison covers both branches.
      EXPECT_GT(r.metrics.clip_fraction_low, 0);
      EXPECT_GT(r.metrics.clip_fraction_high, 0);
      EXPECT_EQ(r.metrics.tokens, 22);
    }
  }
}

// Two micro-batches of whole sequences given the batch's denominators: their losses add
// up to the batch's and their gradients are the batch's, for every aggregation.
TEST(GrpoLoss, MicroBatchesWithTheBatchDenominatorsAddUpToTheBatch) {
  const Batch b;
  const PolicyLossBatch whole = b.view();
  auto part = [&](size_t begin, size_t end, std::span<const int32_t> cu_seqlens) {
    PolicyLossBatch p = whole;
    for (auto* values : {&p.logp, &p.old_logp, &p.ref_logp, &p.entropy, &p.advantages})
      *values = values->subspan(begin, end - begin);
    p.mask = p.mask.subspan(begin, end - begin);
    p.cu_seqlens = cu_seqlens;
    p.batch_tokens = 22;
    p.batch_sequences = 3;  // sequence 2 has no completion token
    return p;
  };
  const std::vector<int32_t> first_cu = {0, 9, 20}, second_cu = {0, 5, 20};
  for (const LossAggregation aggregation : kAggregations) {
    const PolicyLossSettings s{.eps_high = 0.28, .aggregation = aggregation, .kl_coef = 0.05, .entropy_coef = 0.01};
    const PolicyLoss all = policy_loss(whole, s);
    const PolicyLoss first = policy_loss(part(0, 20, first_cu), s), second = policy_loss(part(20, 40, second_cu), s);
    EXPECT_NEAR(first.loss + second.loss, all.loss, 1e-12) << static_cast<int>(aggregation);
    for (size_t t = 0; t < 40; ++t) {
      EXPECT_EQ(t < 20 ? first.dlogp[t] : second.dlogp[t - 20], all.dlogp[t]) << t;
      EXPECT_EQ(t < 20 ? first.dentropy[t] : second.dentropy[t - 20], all.dentropy[t]) << t;
    }
  }
  PolicyLossBatch too_few = part(0, 20, first_cu);
  too_few.batch_tokens = 3;  // the first micro-batch alone has 13
  EXPECT_THROW(policy_loss(too_few, {}), std::invalid_argument);
}

TEST(GrpoLoss, AggregationWeightsDiffer) {
  const Batch b;
  std::vector<double> losses;
  for (const LossAggregation aggregation : kAggregations)
    losses.push_back(policy_loss(b.view(), {.aggregation = aggregation}).loss);
  EXPECT_NE(losses[0], losses[1]);
  // global-token-sum over 50 tokens is token-mean over 22, scaled by 22/50.
  EXPECT_NEAR(losses[2], losses[0] * 22 / 50, 1e-12);
}

TEST(GrpoLoss, GradientsMatchFiniteDifferences) {
  Batch b;
  for (const LossAggregation aggregation : kAggregations) {
    for (const KlEstimator kl : {KlEstimator::K1, KlEstimator::K3}) {
      const PolicyLossSettings s{.eps_low = 0.2, .eps_high = 0.28, .aggregation = aggregation, .kl_coef = 0.1,
                                 .kl_estimator = kl, .entropy_coef = 0.02};
      const PolicyLoss r = policy_loss(b.view(), s);
      ASSERT_EQ(r.dentropy.size(), b.logp.size());
      int zero_gradients = 0;
      for (size_t t = 0; t < b.logp.size(); ++t) {
        const auto central = [&](std::vector<float>& input) {
          const float saved = input[t];
          const float h = 1e-3f;
          input[t] = saved + h;
          const double up = policy_loss(b.view(), s).loss;
          input[t] = saved - h;
          const double down = policy_loss(b.view(), s).loss;
          const double step = (static_cast<double>(saved + h) - static_cast<double>(saved - h));
          input[t] = saved;
          return (up - down) / step;
        };
        EXPECT_NEAR(r.dlogp[t], central(b.logp), 2e-6) << "token " << t;
        EXPECT_NEAR(r.dentropy[t], central(b.entropy), 2e-7) << "token " << t;
        zero_gradients += b.mask[t] && r.dlogp[t] == 0;
        if (!b.mask[t]) {
          EXPECT_EQ(r.dlogp[t], 0);
          EXPECT_EQ(r.dentropy[t], 0);
        }
      }
      EXPECT_EQ(zero_gradients, 0);  // with a KL term, even a clipped token has a gradient
    }
  }
}

TEST(GrpoLoss, ClippedTokensHaveNoPolicyGradient) {
  const Batch b;
  const PolicyLoss r = policy_loss(b.view(), {.eps_low = 0.2, .eps_high = 0.28});
  int clipped = 0;
  for (size_t t = 0; t < b.logp.size(); ++t) {
    if (!b.mask[t]) continue;
    const double ratio = std::exp(static_cast<double>(b.logp[t]) - b.old_logp[t]);
    const bool expect_clip = (b.advantages[t] > 0 && ratio > 1.28) || (b.advantages[t] < 0 && ratio < 0.8);
    clipped += expect_clip;
    if (expect_clip) EXPECT_EQ(r.dlogp[t], 0) << t;
    else EXPECT_NEAR(r.dlogp[t], -b.advantages[t] * ratio / 22, 1e-7) << t;
  }
  EXPECT_NEAR(r.metrics.clip_fraction_low + r.metrics.clip_fraction_high, clipped / 22.0, 1e-12);
}

TEST(GrpoLoss, NoMaskedTokensGivesZero) {
  const std::vector<float> v = {0.1f, 0.2f};
  const std::vector<uint8_t> mask = {0, 0};
  const PolicyLoss r = policy_loss({.logp = v, .old_logp = v, .advantages = v, .mask = mask}, {});
  EXPECT_EQ(r.loss, 0);
  EXPECT_EQ(r.dlogp, (std::vector<float>{0, 0}));
  EXPECT_EQ(r.metrics.tokens, 0);
}

TEST(GrpoLoss, RefusesMissingOrMisshapenInputs) {
  const Batch b;
  PolicyLossBatch short_old = b.view();
  short_old.old_logp = short_old.old_logp.first(3);
  EXPECT_THROW(policy_loss(short_old, {}), std::invalid_argument);
  PolicyLossBatch no_ref = b.view();
  no_ref.ref_logp = {};
  EXPECT_THROW(policy_loss(no_ref, {.kl_coef = 0.1}), std::invalid_argument);
  EXPECT_NO_THROW(policy_loss(no_ref, {}));
  PolicyLossBatch no_entropy = b.view();
  no_entropy.entropy = {};
  EXPECT_THROW(policy_loss(no_entropy, {.entropy_coef = 0.1}), std::invalid_argument);
  PolicyLossBatch no_sequences = b.view();
  no_sequences.cu_seqlens = {};
  EXPECT_THROW(policy_loss(no_sequences, {.aggregation = LossAggregation::SeqMeanTokenMean}), std::invalid_argument);
  EXPECT_NO_THROW(policy_loss(no_sequences, {}));
  PolicyLossBatch few_global = b.view();
  few_global.global_tokens = 20;
  EXPECT_THROW(policy_loss(few_global, {.aggregation = LossAggregation::GlobalTokenSum}), std::invalid_argument);
  EXPECT_THROW(policy_loss(b.view(), {.eps_low = 1}), std::invalid_argument);
}

TEST(GrpoLoss, NamesOfTheSettings) {
  EXPECT_EQ(loss_aggregation_from_name("token-mean"), LossAggregation::TokenMean);
  EXPECT_EQ(loss_aggregation_from_name("seq-mean-token-mean"), LossAggregation::SeqMeanTokenMean);
  EXPECT_EQ(loss_aggregation_from_name("global-token-sum"), LossAggregation::GlobalTokenSum);
  EXPECT_THROW(loss_aggregation_from_name("mean"), std::invalid_argument);
  EXPECT_EQ(kl_estimator_from_name("k1"), KlEstimator::K1);
  EXPECT_EQ(kl_estimator_from_name("k3"), KlEstimator::K3);
  EXPECT_THROW(kl_estimator_from_name("k2"), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
