#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tensor/bf16.h"
#include "train/adamw.h"

using namespace tandem;

// Against a double-precision transcription of torch.optim.AdamW's update, with decay
// on one tensor and not on the other.
TEST(AdamW, MatchesTheReferenceUpdateOverSeveralSteps) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  const size_t n = 257;
  std::vector<float> p(n), m(n, 0), v(n, 0);
  std::vector<double> rp(n), rm(n, 0), rv(n, 0);
  for (size_t i = 0; i < n; ++i) rp[i] = p[i] = normal(rng);
  const size_t split = 100;  // [0, split) decays, [split, n) does not
  AdamWSettings s{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<uint16_t> working(n);
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<float> g(n);
    for (auto& x : g) x = normal(rng);
    adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), split, adamw_scalars(s, step, true), working.data());
    adamw_step_cpu(p.data() + split, g.data() + split, m.data() + split, v.data() + split, n - split,
                   adamw_scalars(s, step, false), working.data() + split);
    for (size_t i = 0; i < n; ++i) {
      if (i < split) rp[i] *= 1 - s.lr * s.weight_decay;
      rm[i] = s.beta1 * rm[i] + (1 - s.beta1) * g[i];
      rv[i] = s.beta2 * rv[i] + (1 - s.beta2) * g[i] * static_cast<double>(g[i]);
      const double mhat = rm[i] / (1 - std::pow(s.beta1, step));
      const double vhat = rv[i] / (1 - std::pow(s.beta2, step));
      rp[i] -= s.lr * mhat / (std::sqrt(vhat) + s.eps);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p[i], rp[i], 1e-5 * (1 + std::fabs(rp[i]))) << i;
    ASSERT_EQ(working[i], float_to_bf16(p[i])) << i;
  }
}
