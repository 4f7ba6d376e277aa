// The GRPO policy loss on the log-probs of the sampled tokens, with its gradient with
// respect to those log-probs (what the chunked log-prob backward takes).
//
// Per token t (TRL/verl conventions):
//   ratio  = exp(logp - old_logp)
//   pg     = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
//   kl     = k1: logp - ref_logp     k3: exp(ref_logp - logp) - (ref_logp - logp) - 1
//   loss_t = pg + kl_coef * kl - entropy_coef * entropy
// and the loss is sum_t w_t * loss_t over the masked tokens, with w_t from the aggregation:
//   token-mean           1 / (masked tokens of the batch)
//   seq-mean-token-mean  1 / (sequences with a masked token * that sequence's masked tokens)
//   global-token-sum     1 / global_tokens: the masked tokens of the whole step, summed by
//                        the caller over micro-batches and ranks (DAPO); the ranks' gradients
//                        are then summed, not averaged.
// A micro-batch of whole sequences is given the denominators of the batch it belongs to
// (batch_tokens, batch_sequences), so the micro-batches' losses and gradients add up to
// the batch's.
// The clip zeroes the gradient of a token when the ratio has left [1 - eps_low, 1 + eps_high]
// on the side its advantage pushes towards. No dual clip; the k3 value is not clamped
// (it is computed in double, so nothing overflows).
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tandem {

enum class LossAggregation { TokenMean, SeqMeanTokenMean, GlobalTokenSum };
enum class KlEstimator { K1, K3 };

// "token-mean", "seq-mean-token-mean", "global-token-sum" / "k1", "k3"; both throw
// std::invalid_argument listing the valid names.
LossAggregation loss_aggregation_from_name(std::string_view name);
KlEstimator kl_estimator_from_name(std::string_view name);

struct PolicyLossSettings {
  double eps_low = 0.2;
  double eps_high = 0.2;  // DAPO's clip-higher uses 0.28
  LossAggregation aggregation = LossAggregation::TokenMean;
  double kl_coef = 0;  // 0: no reference policy needed
  KlEstimator kl_estimator = KlEstimator::K3;
  double entropy_coef = 0;  // a bonus: the loss subtracts entropy_coef * entropy
};

// Per-token inputs of a packed (micro-)batch, all of length T.
struct PolicyLossBatch {
  std::span<const float> logp;        // current policy, at the sampled tokens
  std::span<const float> old_logp;    // the policy that sampled them
  std::span<const float> ref_logp;    // frozen reference; empty: no KL (kl_coef must be 0)
  std::span<const float> entropy;     // current policy's; empty: no entropy (entropy_coef must be 0)
  std::span<const float> advantages;  // each token carries its sequence's advantage
  std::span<const uint8_t> mask;      // 1: a completion token that counts; 0: prompt or padding
  std::span<const int32_t> cu_seqlens;  // [S+1] sequence starts; needed by seq-mean-token-mean
  double global_tokens = 0;             // needed by global-token-sum
  // The batch this micro-batch is part of; 0: these inputs are the whole batch.
  int64_t batch_tokens = 0;     // token-mean: the batch's masked tokens
  int64_t batch_sequences = 0;  // seq-mean-token-mean: the batch's sequences with a masked token
};

struct PolicyLossMetrics {
  int64_t tokens = 0;          // masked tokens
  double pg_loss = 0;          // the clipped-surrogate part of the loss, aggregated as the loss
  double kl_mean = 0;          // means over the masked tokens, measured whenever given
  double entropy_mean = 0;
  double clip_fraction_low = 0;   // tokens clipped below 1 - eps_low (negative advantage)
  double clip_fraction_high = 0;  // tokens clipped above 1 + eps_high (positive advantage)
  double ratio_mean = 0;
  double ratio_max = 0;
};

struct PolicyLoss {
  double loss = 0;
  std::vector<float> dlogp;     // d loss / d logp, 0 on unmasked tokens
  std::vector<float> dentropy;  // d loss / d entropy; empty when entropy_coef == 0
  PolicyLossMetrics metrics;
};

// Throws std::invalid_argument naming an input whose length is wrong, or a missing input
// that the settings need.
PolicyLoss policy_loss(const PolicyLossBatch& batch, const PolicyLossSettings& settings);

}  // namespace tandem
