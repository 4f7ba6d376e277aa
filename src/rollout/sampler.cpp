#include "rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace tandem {

namespace {

// The first index whose running sum of weights passes `target`; the last one with weight
// when rounding leaves the target just out of reach.
template <class WeightOf>
int64_t pick(int64_t count, double target, WeightOf weight_of) {
  double sum = 0;
  int64_t last = 0;
  for (int64_t j = 0; j < count; ++j) {
    const double w = weight_of(j);
    if (w <= 0) continue;
    last = j;
    sum += w;
    if (sum > target) return j;
  }
  return last;
}

}  // namespace

std::mt19937_64 request_rng(uint64_t seed, uint64_t request_id) {
  std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                         static_cast<uint32_t>(request_id), static_cast<uint32_t>(request_id >> 32)};
  return std::mt19937_64(sequence);
}

// Uniform in [0, 1) from the top 53 bits: std::uniform_real_distribution is not specified
// bit for bit, and runs must reproduce across standard libraries.
double draw_uniform(const SamplingParams& params, std::mt19937_64& rng) {
  if (params.temperature == 0) return 0;
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

SampledToken Sampler::sample(std::span<const float> logits, const SamplingParams& params, double u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (V == 0) throw std::invalid_argument("Sampler::sample: empty logits");
  const bool greedy = params.temperature == 0;
  const float temperature = greedy ? 1.0f : params.temperature;

  weights_.resize(V);
  float max = -INFINITY;
  int32_t argmax = 0;
  for (int64_t i = 0; i < V; ++i) {
    const float z = logits[i] / temperature;
    if (std::isnan(z) || z == INFINITY)
      throw std::runtime_error("Sampler::sample: logit " + std::to_string(i) + " is " + std::to_string(logits[i]));
    weights_[i] = z;
    if (z > max) max = z, argmax = static_cast<int32_t>(i);
  }
  if (max == -INFINITY) throw std::runtime_error("Sampler::sample: every logit is -inf");
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += (weights_[i] = std::exp(weights_[i] - max));
  const double log_sum = std::log(sum);
  auto logprob_of = [&](int32_t id) { return static_cast<float>((logits[id] / temperature - max) - log_sum); };
  if (greedy) return {argmax, logprob_of(argmax)};

  const int64_t k = params.top_k > 0 ? std::min<int64_t>(params.top_k, V) : V;
  if (k == V && params.top_p >= 1) {
    const int64_t id = pick(V, u * sum, [&](int64_t j) { return static_cast<double>(weights_[j]); });
    return {static_cast<int32_t>(id), logprob_of(static_cast<int32_t>(id))};
  }

  order_.resize(V);
  std::iota(order_.begin(), order_.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) {
    return weights_[a] > weights_[b] || (weights_[a] == weights_[b] && a < b);
  };
  if (k < V)
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), more_likely);
  else
    std::sort(order_.begin(), order_.end(), more_likely);
  double kept = 0;
  for (int64_t j = 0; j < k; ++j) kept += weights_[order_[j]];
  int64_t count = k;
  if (params.top_p < 1) {
    // The smallest prefix whose share of the top-k mass reaches top_p (at least one token).
    const double threshold = static_cast<double>(params.top_p) * kept;
    double prefix = 0;
    for (count = 0; count < k;) {
      prefix += weights_[order_[count++]];
      if (prefix >= threshold) break;
    }
    kept = prefix;
  }
  const int64_t j = pick(count, u * kept, [&](int64_t index) { return static_cast<double>(weights_[order_[index]]); });
  return {order_[j], logprob_of(order_[j])};
}

}  // namespace tandem
