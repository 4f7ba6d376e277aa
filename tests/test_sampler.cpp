// The sampler against the distribution it claims to draw from: chi-square tests of the
// frequencies of 40,000 draws on an 8-token vocabulary, for temperature alone and with
// top-k, top-p and both, against softmax(logits / T) truncated and renormalised as
// computed here independently (in double). Seeds are fixed, so the tests are
// deterministic; the threshold is the chi-square quantile at p = 0.001.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "rollout/request.h"
#include "rollout/sampler.h"

namespace tandem {
namespace {

const std::vector<float> kLogits = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.7f};

std::vector<double> log_softmax(const std::vector<float>& logits, double temperature) {
  double max = -INFINITY, sum = 0;
  for (float l : logits) max = std::max(max, l / temperature);
  for (float l : logits) sum += std::exp(l / temperature - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l / temperature - max - std::log(sum));
  return out;
}

// softmax(logits / T), then the top k, then the smallest prefix holding top_p of what is
// left, renormalised.
std::vector<double> target_distribution(const std::vector<float>& logits, const SamplingParams& params) {
  const std::vector<double> logp = log_softmax(logits, params.temperature);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logp[a] > logp[b]; });
  size_t keep = params.top_k > 0 ? std::min<size_t>(params.top_k, order.size()) : order.size();
  double mass = 0;
  for (size_t j = 0; j < keep; ++j) mass += std::exp(logp[order[j]]);
  double prefix = 0;
  size_t nucleus = 0;
  while (nucleus < keep) {
    prefix += std::exp(logp[order[nucleus++]]);
    if (prefix >= params.top_p * mass) break;
  }
  std::vector<double> p(logits.size(), 0.0);
  for (size_t j = 0; j < nucleus; ++j) p[order[j]] = std::exp(logp[order[j]]) / prefix;
  return p;
}

double chi_square_critical(int degrees_of_freedom) {  // p = 0.001
  const double table[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
  return table[degrees_of_freedom];
}

struct Case {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  int expected_support;
};

class SamplerDistribution : public ::testing::TestWithParam<Case> {};

TEST_P(SamplerDistribution, FrequenciesMatchTheTargetByChiSquare) {
  const Case c = GetParam();
  SamplingParams params;
  params.temperature = c.temperature;
  params.top_k = c.top_k;
  params.top_p = c.top_p;
  const std::vector<double> p = target_distribution(kLogits, params);
  ASSERT_EQ(std::count_if(p.begin(), p.end(), [](double x) { return x > 0; }), c.expected_support);

  constexpr int kDraws = 40000;
  std::vector<int> counts(kLogits.size(), 0);
  Sampler sampler;
  std::mt19937_64 rng = request_rng(20250601, 3);
  const std::vector<double> logp = log_softmax(kLogits, c.temperature);
  for (int i = 0; i < kDraws; ++i) {
    const SampledToken token = sampler.sample(kLogits, params, rng);
    ASSERT_GE(token.id, 0);
    ASSERT_LT(token.id, static_cast<int>(kLogits.size()));
    ++counts[token.id];
    // The log-prob is over the full vocabulary, before truncation.
    ASSERT_NEAR(token.logprob, logp[token.id], 1e-6);
  }
  double chi_square = 0;
  int support = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] == 0) {
      EXPECT_EQ(counts[v], 0) << "token " << v << " is outside the top-k/top-p set";
      continue;
    }
    ++support;
    const double expected = kDraws * p[v];
    chi_square += (counts[v] - expected) * (counts[v] - expected) / expected;
  }
  if (support > 1) EXPECT_LT(chi_square, chi_square_critical(support - 1)) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, SamplerDistribution,
                         ::testing::Values(Case{"temperature", 0.7f, 0, 1.0f, 8}, Case{"top_k", 1.3f, 3, 1.0f, 3},
                                           Case{"top_p", 1.0f, 0, 0.8f, 4}, Case{"top_k_top_p", 0.9f, 5, 0.7f, 3},
                                           Case{"tiny_top_p", 1.0f, 0, 1e-4f, 1}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Sampler, GreedyTakesTheFirstArgmaxAndDrawsNothing) {
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f};
  SamplingParams params;
  params.temperature = 0;
  std::mt19937_64 rng = request_rng(1, 2), untouched = request_rng(1, 2);
  Sampler sampler;
  const SampledToken token = sampler.sample(logits, params, rng);
  EXPECT_EQ(token.id, 1);
  EXPECT_NEAR(token.logprob, log_softmax(logits, 1.0)[1], 1e-6);  // greedy: log softmax at T = 1
  EXPECT_EQ(rng(), untouched());
}

TEST(Sampler, OneDrawPerTokenSoStreamsAreReproducible) {
  SamplingParams params;
  params.top_p = 0.9f;
  Sampler sampler;
  auto draw = [&](uint64_t seed, uint64_t id) {
    std::mt19937_64 rng = request_rng(seed, id);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(sampler.sample(kLogits, params, rng).id);
    return ids;
  };
  EXPECT_EQ(draw(7, 1), draw(7, 1));
  EXPECT_NE(draw(7, 1), draw(7, 2));
  EXPECT_NE(draw(7, 1), draw(8, 1));
  std::mt19937_64 rng = request_rng(7, 1), reference = request_rng(7, 1);
  sampler.sample(kLogits, params, rng);
  reference.discard(1);
  EXPECT_EQ(rng(), reference());
}

TEST(Sampler, TheUniformEntryPointReproducesTheRandomStreamOne) {
  Sampler sampler;
  for (const float top_p : {1.0f, 0.7f}) {
    SamplingParams params;
    params.temperature = 0.8f;
    params.top_p = top_p;
    std::mt19937_64 rng = request_rng(11, 4), draws = request_rng(11, 4);
    for (int i = 0; i < 200; ++i) {
      const SampledToken from_rng = sampler.sample(kLogits, params, rng);
      const SampledToken from_u = sampler.sample(kLogits, params, draw_uniform(params, draws));
      ASSERT_EQ(from_rng.id, from_u.id) << i;
      ASSERT_EQ(from_rng.logprob, from_u.logprob) << i;
    }
  }
  // u picks by inverse CDF: u = 0 takes the first kept token in index order, u just
  // under 1 the last one.
  SamplingParams params;
  EXPECT_EQ(sampler.sample(kLogits, params, 0.0).id, 0);
  EXPECT_EQ(sampler.sample(kLogits, params, 1 - 0x1.0p-53).id, 7);
  params.temperature = 0;
  std::mt19937_64 rng = request_rng(1, 1), untouched = request_rng(1, 1);
  EXPECT_EQ(draw_uniform(params, rng), 0.0);
  EXPECT_EQ(rng(), untouched());
}

TEST(Sampler, RefusesNaNLogitsAndBadParameters) {
  Sampler sampler;
  std::mt19937_64 rng = request_rng(0, 0);
  std::vector<float> logits = {0.0f, NAN};
  EXPECT_THROW(sampler.sample(logits, SamplingParams{}, rng), std::runtime_error);
  logits = {-INFINITY, -INFINITY};
  EXPECT_THROW(sampler.sample(logits, SamplingParams{}, rng), std::runtime_error);
  logits = {-INFINITY, 0.0f};  // a masked token is never drawn
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.sample(logits, SamplingParams{}, rng).id, 1);
  auto invalid = [](auto edit) {
    SamplingParams params;
    edit(params);
    EXPECT_THROW(params.validate(), std::invalid_argument);
  };
  invalid([](SamplingParams& p) { p.temperature = -0.5f; });
  invalid([](SamplingParams& p) { p.top_p = 0; });
  invalid([](SamplingParams& p) { p.top_p = 1.5f; });
  invalid([](SamplingParams& p) { p.top_k = -1; });
  invalid([](SamplingParams& p) { p.max_new_tokens = 0; });
  invalid([](SamplingParams& p) { p.stop_strings = {""}; });
  EXPECT_NO_THROW(SamplingParams{}.validate());
}

}  // namespace
}  // namespace tandem
