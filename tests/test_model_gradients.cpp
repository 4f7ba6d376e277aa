// Backward against central finite differences, for every parameter tensor of the whole
// model on a packed batch of three sequences, over all eight combinations of q/k norm,
// q/k/v bias and tied embeddings.
//
// The forward pass is FP32, so a difference quotient carries rounding noise of about
// 1e-6 / step. With step 1e-2 (and the true step h = (θ+ε) − (θ−ε) measured after FP32
// rounding) that is ~1e-4; the truncation error is O(step²). Checks:
//  - per tensor, a random direction u: (L(θ+εu) − L(θ−εu)) / 2ε against <∇L, u>, within
//    1% of |∇L|·|u| (this covers every entry of the tensor at once);
//  - per tensor, the entry with the largest gradient and two random entries, each within
//    2e-3 + 2% of the analytic value.
// A wrong gradient term is off by O(100%), far outside both.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/cross_entropy.h"
#include "test_model_support.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

constexpr float kStep = 1e-2f;

struct Batch {
  std::vector<int32_t> ids, cu_seqlens, targets;
};

Batch make_batch(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  Batch batch;
  batch.cu_seqlens = {0, 5, 8, 12};  // lengths 5, 3, 4
  for (int t = 0; t < 12; ++t) batch.ids.push_back(token(rng));
  // A target for every token (not only next-token ones), so each position's logits matter.
  for (int t = 0; t < 12; ++t) batch.targets.push_back(token(rng));
  return batch;
}

double loss_of(TinyModel& model, const Batch& batch) {
  const Tensor logits = model.transformer.forward(model.params, model.acts, batch.ids, batch.cu_seqlens);
  return cross_entropy(logits, batch.targets, Tensor{});
}

// Moves the tensor's entries by ±step·direction and returns the difference quotient.
double directional_difference(TinyModel& model, const Batch& batch, float* data, const std::vector<float>& direction,
                              float step) {
  const std::vector<float> saved(data, data + direction.size());
  for (size_t e = 0; e < direction.size(); ++e) data[e] = saved[e] + step * direction[e];
  const double plus = loss_of(model, batch);
  for (size_t e = 0; e < direction.size(); ++e) data[e] = saved[e] - step * direction[e];
  const double minus = loss_of(model, batch);
  std::copy(saved.begin(), saved.end(), data);
  return (plus - minus) / (2.0 * step);
}

double entry_difference(TinyModel& model, const Batch& batch, float* entry, float step) {
  const float saved = *entry;
  *entry = saved + step;
  const float up = *entry;
  const double plus = loss_of(model, batch);
  *entry = saved - step;
  const float down = *entry;
  const double minus = loss_of(model, batch);
  *entry = saved;
  return (plus - minus) / (static_cast<double>(up) - static_cast<double>(down));
}

// <∇L, u> for a random direction u over the whole tensor against the difference quotient.
void expect_directional_derivative(TinyModel& model, const Batch& batch, size_t tensor, std::mt19937& rng) {
  float* data = model.params.all[tensor].ptr<float>();
  const float* grad = model.grads.all[tensor].ptr<float>();
  std::normal_distribution<float> normal;
  std::vector<float> direction(model.params.all[tensor].numel());
  double analytic = 0, grad_norm = 0, direction_norm = 0;
  for (size_t e = 0; e < direction.size(); ++e) {
    direction[e] = normal(rng);
    analytic += static_cast<double>(grad[e]) * direction[e];
    grad_norm += static_cast<double>(grad[e]) * grad[e];
    direction_norm += static_cast<double>(direction[e]) * direction[e];
  }
  ASSERT_GT(grad_norm, 1e-8) << "a tensor the loss depends on has no gradient at all";
  const double numeric = directional_difference(model, batch, data, direction, kStep);
  EXPECT_NEAR(numeric, analytic, 1e-2 * std::sqrt(grad_norm * direction_norm));
}

class ModelGradients : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(ModelGradients, MatchCentralDifferencesForEveryTensor) {
  const auto [qk_norm, qkv_bias, tied] = GetParam();
  TinyModel model(tiny_config(qk_norm, qkv_bias, tied), {16, 4});
  const Batch batch = make_batch(model.config.vocab, 11);

  const Tensor logits = model.transformer.forward(model.params, model.acts, batch.ids, batch.cu_seqlens);
  cross_entropy(logits, batch.targets, logits);  // dlogits in place of the logits
  model.zero_grads();
  model.transformer.backward(model.params, model.grads, model.acts, logits);

  std::mt19937 rng(5);
  for (size_t i = 0; i < model.layout.tensors().size(); ++i) {
    const ParameterInfo& info = model.layout.tensors()[i];
    SCOPED_TRACE(info.name);
    expect_directional_derivative(model, batch, i, rng);
    float* data = model.params.all[i].ptr<float>();
    const float* grad = model.grads.all[i].ptr<float>();
    const int64_t count = info.numel();

    int64_t largest = 0;
    for (int64_t e = 1; e < count; ++e)
      if (std::fabs(grad[e]) > std::fabs(grad[largest])) largest = e;
    std::uniform_int_distribution<int64_t> pick(0, count - 1);
    for (int64_t e : {largest, pick(rng), pick(rng)}) {
      const double expected = grad[e];
      EXPECT_NEAR(entry_difference(model, batch, data + e, kStep), expected, 2e-3 + 2e-2 * std::fabs(expected))
          << "entry " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllSwitches, ModelGradients,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "QkNorm" : "NoQkNorm") +
                                  (std::get<1>(info.param) ? "QkvBias" : "NoBias") +
                                  (std::get<2>(info.param) ? "Tied" : "Untied");
                         });

TEST(ModelGradientsLlama, RopeScalingAndLongerSequencesStillMatch) {
  ModelConfig config = tiny_config(false, false, false);
  config.arch = Architecture::Llama;
  config.rope_theta = 500000;
  config.rope_scaling = {true, 8.0, 1.0, 4.0, 16};
  TinyModel model(config, {40, 2});
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, config.vocab - 1);
  Batch batch;
  batch.cu_seqlens = {0, 23, 37};
  for (int t = 0; t < 37; ++t) {
    batch.ids.push_back(token(rng));
    batch.targets.push_back(token(rng));
  }
  const Tensor logits = model.transformer.forward(model.params, model.acts, batch.ids, batch.cu_seqlens);
  cross_entropy(logits, batch.targets, logits);
  model.zero_grads();
  model.transformer.backward(model.params, model.grads, model.acts, logits);
  // The q and k projections are the only weights RoPE touches.
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"}) {
    SCOPED_TRACE(name);
    expect_directional_derivative(model, batch, model.layout.find(name) - model.layout.tensors().data(), rng);
  }
}

}  // namespace
