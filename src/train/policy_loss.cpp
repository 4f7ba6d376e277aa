#include "train/policy_loss.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem {
namespace {

void require_length(size_t length, size_t tokens, const char* name) {
  if (length != tokens)
    throw std::invalid_argument(std::string("policy_loss: ") + name + " has " + std::to_string(length) +
                                " values for " + std::to_string(tokens) + " tokens");
}

// The batch's count when a micro-batch is given one, else the micro-batch's own.
int64_t batch_count(int64_t given, int64_t own, const char* name) {
  if (given == 0) return own;
  if (given < own)
    throw std::invalid_argument(std::string("policy_loss: ") + name + " = " + std::to_string(given) +
                                " is fewer than this micro-batch's " + std::to_string(own));
  return given;
}

// The aggregation weight of every token (0 on unmasked ones).
std::vector<double> token_weights(const PolicyLossBatch& batch, LossAggregation aggregation, int64_t masked) {
  const size_t T = batch.logp.size();
  std::vector<double> weights(T, 0);
  switch (aggregation) {
    case LossAggregation::TokenMean: {
      const auto tokens = static_cast<double>(batch_count(batch.batch_tokens, masked, "batch_tokens"));
      for (size_t t = 0; t < T; ++t)
        if (batch.mask[t]) weights[t] = 1.0 / tokens;
      break;
    }
    case LossAggregation::GlobalTokenSum:
      if (masked > 0 && !(batch.global_tokens >= static_cast<double>(masked)))
        throw std::invalid_argument("policy_loss: global-token-sum needs global_tokens >= this batch's " +
                                    std::to_string(masked) + " masked tokens, got " +
                                    std::to_string(batch.global_tokens));
      for (size_t t = 0; t < T; ++t)
        if (batch.mask[t]) weights[t] = 1.0 / batch.global_tokens;
      break;
    case LossAggregation::SeqMeanTokenMean: {
      const std::span<const int32_t> cu = batch.cu_seqlens;
      if (cu.size() < 2 || cu.front() != 0 || cu.back() != static_cast<int32_t>(T) ||
          !std::is_sorted(cu.begin(), cu.end()))
        throw std::invalid_argument("policy_loss: seq-mean-token-mean needs cu_seqlens rising from 0 to " +
                                    std::to_string(T));
      // Sequences without a masked token take no part in the mean.
      std::vector<int64_t> counts;
      for (size_t s = 0; s + 1 < cu.size(); ++s)
        counts.push_back(std::count_if(batch.mask.begin() + cu[s], batch.mask.begin() + cu[s + 1],
                                       [](uint8_t m) { return m != 0; }));
      const auto sequences = static_cast<double>(batch_count(
          batch.batch_sequences, std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; }),
          "batch_sequences"));
      for (size_t s = 0; s + 1 < cu.size(); ++s)
        for (int32_t t = cu[s]; t < cu[s + 1]; ++t)
          if (batch.mask[t]) weights[t] = 1.0 / (sequences * static_cast<double>(counts[s]));
      break;
    }
  }
  return weights;
}

}  // namespace

LossAggregation loss_aggregation_from_name(std::string_view name) {
  if (name == "token-mean") return LossAggregation::TokenMean;
  if (name == "seq-mean-token-mean") return LossAggregation::SeqMeanTokenMean;
  if (name == "global-token-sum") return LossAggregation::GlobalTokenSum;
  throw std::invalid_argument("unknown loss aggregation '" + std::string(name) +
                              "': expected token-mean, seq-mean-token-mean or global-token-sum");
}

KlEstimator kl_estimator_from_name(std::string_view name) {
  if (name == "k1") return KlEstimator::K1;
  if (name == "k3") return KlEstimator::K3;
  throw std::invalid_argument("unknown KL estimator '" + std::string(name) + "': expected k1 or k3");
}

PolicyLoss policy_loss(const PolicyLossBatch& batch, const PolicyLossSettings& settings) {
  const size_t T = batch.logp.size();
  require_length(batch.old_logp.size(), T, "old_logp");
  require_length(batch.advantages.size(), T, "advantages");
  require_length(batch.mask.size(), T, "mask");
  // Given inputs are measured even when their coefficient is 0, for the metrics.
  const bool has_ref = settings.kl_coef != 0 || !batch.ref_logp.empty();
  const bool has_entropy = settings.entropy_coef != 0 || !batch.entropy.empty();
  if (has_ref) require_length(batch.ref_logp.size(), T, "ref_logp");
  if (has_entropy) require_length(batch.entropy.size(), T, "entropy");
  if (!(settings.eps_low >= 0 && settings.eps_low < 1 && settings.eps_high >= 0))
    throw std::invalid_argument("policy_loss: clip range needs 0 <= eps_low < 1 and eps_high >= 0");

  const auto masked = std::count_if(batch.mask.begin(), batch.mask.end(), [](uint8_t m) { return m != 0; });
  const std::vector<double> weights = token_weights(batch, settings.aggregation, masked);
  const double low = 1 - settings.eps_low, high = 1 + settings.eps_high;

  PolicyLoss result;
  result.dlogp.assign(T, 0);
  if (settings.entropy_coef != 0) result.dentropy.assign(T, 0);
  PolicyLossMetrics& m = result.metrics;
  m.tokens = masked;
  int64_t clipped_low = 0, clipped_high = 0;
  for (size_t t = 0; t < T; ++t) {
    if (!batch.mask[t]) continue;
    const double w = weights[t], advantage = batch.advantages[t];
    const double ratio = std::exp(static_cast<double>(batch.logp[t]) - batch.old_logp[t]);
    const double unclipped = -advantage * ratio;
    const double clipped = -advantage * std::clamp(ratio, low, high);
    // The max picks the clipped term exactly when the ratio is past the bound its
    // advantage pushes towards; there the loss is constant in logp.
    const bool clip_high = advantage > 0 && ratio > high, clip_low = advantage < 0 && ratio < low;
    const double pg = std::max(unclipped, clipped);
    double loss = pg, dloss = clip_high || clip_low ? 0 : -advantage * ratio;
    clipped_low += clip_low;
    clipped_high += clip_high;
    m.pg_loss += w * pg;
    if (has_ref) {
      const double log_ratio = static_cast<double>(batch.ref_logp[t]) - batch.logp[t];
      const bool k1 = settings.kl_estimator == KlEstimator::K1;
      const double kl = k1 ? -log_ratio : std::exp(log_ratio) - log_ratio - 1;
      loss += settings.kl_coef * kl;
      dloss += settings.kl_coef * (k1 ? 1 : 1 - std::exp(log_ratio));
      m.kl_mean += kl;
    }
    if (has_entropy) {
      loss -= settings.entropy_coef * batch.entropy[t];
      if (settings.entropy_coef != 0) result.dentropy[t] = static_cast<float>(-w * settings.entropy_coef);
      m.entropy_mean += batch.entropy[t];
    }
    result.loss += w * loss;
    result.dlogp[t] = static_cast<float>(w * dloss);
    m.ratio_mean += ratio;
    m.ratio_max = std::max(m.ratio_max, ratio);
  }
  if (masked > 0) {
    const auto n = static_cast<double>(masked);
    m.kl_mean /= n;
    m.entropy_mean /= n;
    m.ratio_mean /= n;
    m.clip_fraction_low = static_cast<double>(clipped_low) / n;
    m.clip_fraction_high = static_cast<double>(clipped_high) / n;
  }
  return result;
}

}  // namespace tandem
