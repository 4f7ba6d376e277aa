// Packed variable-length batches: running sequences end to end must give each one exactly
// what it gets alone (attention never crosses a boundary, positions restart), forward and
// backward, and a malformed packing must be refused before any op runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/cross_entropy.h"
#include "test_model_support.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

std::vector<int32_t> random_tokens(int count, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> ids(count);
  for (auto& id : ids) id = token(rng);
  return ids;
}

float max_abs_difference(const float* a, const float* b, int64_t count) {
  float worst = 0;
  for (int64_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

class ModelPacking : public ::testing::TestWithParam<bool> {};

TEST_P(ModelPacking, PackedLogitsAndGradientsEqualEachSequenceAlone) {
  const bool qwen3_like = GetParam();
  const ModelConfig config = qwen3_like ? tiny_config(true, false, true) : tiny_config(false, true, false);
  TinyModel model(config, {32, 8});
  const std::vector<int> lengths = {7, 3, 5, 1, 9};
  std::vector<int32_t> cu = {0};
  for (int length : lengths) cu.push_back(cu.back() + length);
  const std::vector<int32_t> ids = random_tokens(cu.back(), config.vocab, 1);
  const std::vector<int32_t> targets = next_token_targets(ids, cu);
  const int64_t V = config.vocab;

  const Tensor packed = model.transformer.forward(model.params, model.acts, ids, cu);
  const std::vector<float> packed_logits(packed.ptr<float>(), packed.ptr<float>() + packed.numel());
  cross_entropy(packed, targets, packed);
  model.zero_grads();
  model.transformer.backward(model.params, model.grads, model.acts, packed);
  const std::vector<float> packed_grads = model.gradients;

  // Each sequence alone; gradients accumulate over the runs and must add up to the packed ones.
  model.zero_grads();
  for (size_t s = 0; s < lengths.size(); ++s) {
    const std::span<const int32_t> alone(ids.data() + cu[s], lengths[s]);
    const std::vector<int32_t> alone_cu = {0, lengths[s]};
    const Tensor logits = model.transformer.forward(model.params, model.acts, alone, alone_cu);
    EXPECT_LE(max_abs_difference(logits.ptr<float>(), packed_logits.data() + cu[s] * V, lengths[s] * V), 1e-5f)
        << "sequence " << s;
    cross_entropy(logits, next_token_targets(alone, alone_cu), logits);
    model.transformer.backward(model.params, model.grads, model.acts, logits);
  }
  for (size_t i = 0; i < model.layout.tensors().size(); ++i) {
    const ParameterInfo& info = model.layout.tensors()[i];
    for (int64_t e = 0; e < info.numel(); ++e) {
      const float expected = packed_grads[info.offset + e];
      ASSERT_NEAR(model.gradients[info.offset + e], expected, 1e-5f * (1 + std::fabs(expected)))
          << info.name << " entry " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelPacking, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "QkNormTied" : "QkvBiasUntied"; });

TEST(ModelPacking, SequenceOrderInThePackDoesNotChangeTheirLogits) {
  TinyModel model(tiny_config(true, true, false), {24, 4});
  const std::vector<int32_t> first = random_tokens(6, 32, 2), second = random_tokens(9, 32, 3);
  std::vector<int32_t> forward_ids = first, reverse_ids = second;
  forward_ids.insert(forward_ids.end(), second.begin(), second.end());
  reverse_ids.insert(reverse_ids.end(), first.begin(), first.end());
  const int64_t V = 32;

  const Tensor a = model.transformer.forward(model.params, model.acts, forward_ids, std::vector<int32_t>{0, 6, 15});
  const std::vector<float> in_order(a.ptr<float>(), a.ptr<float>() + a.numel());
  const Tensor b = model.transformer.forward(model.params, model.acts, reverse_ids, std::vector<int32_t>{0, 9, 15});
  EXPECT_LE(max_abs_difference(in_order.data(), b.ptr<float>() + 9 * V, 6 * V), 1e-5f);
  EXPECT_LE(max_abs_difference(in_order.data() + 6 * V, b.ptr<float>(), 9 * V), 1e-5f);
}

TEST(ModelPacking, BackwardAddsIntoTheGradients) {
  TinyModel model(tiny_config(true, true, true), {8, 1});
  const std::vector<int32_t> ids = random_tokens(8, 32, 4), cu = {0, 8};
  const Tensor logits = model.transformer.forward(model.params, model.acts, ids, cu);
  cross_entropy(logits, next_token_targets(ids, cu), logits);
  model.zero_grads();
  model.transformer.backward(model.params, model.grads, model.acts, logits);
  const std::vector<float> once = model.gradients;
  model.transformer.backward(model.params, model.grads, model.acts, logits);
  for (size_t i = 0; i < once.size(); ++i)
    ASSERT_NEAR(model.gradients[i], 2 * once[i], 1e-6f * (1 + std::fabs(once[i]))) << "element " << i;
}

TEST(ModelPacking, MalformedPackingsAreRefused) {
  TinyModel model(tiny_config(false, false, false), {8, 4});
  const std::vector<int32_t> ids = random_tokens(6, 32, 5);
  auto message_of = [&](std::span<const int32_t> tokens, std::vector<int32_t> cu) {
    try {
      model.transformer.forward(model.params, model.acts, tokens, cu);
    } catch (const std::exception& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message_of(ids, {1, 6}).find("start at 0"), std::string::npos);
  EXPECT_NE(message_of(ids, {0, 5}).find("end at the token count 6"), std::string::npos);
  EXPECT_NE(message_of(ids, {0, 3, 3, 6}).find("increase strictly"), std::string::npos);
  EXPECT_NE(message_of(ids, {0, 4, 2, 6}).find("increase strictly"), std::string::npos);
  EXPECT_NE(message_of(ids, {0, 1, 2, 3, 4, 6}).find("exceeds the activation capacity"), std::string::npos);
  EXPECT_NE(message_of(random_tokens(9, 32, 6), {0, 9}).find("exceeds the activation capacity"), std::string::npos);
  std::vector<int32_t> bad = ids;
  bad[4] = 32;
  EXPECT_NE(message_of(bad, {0, 6}).find("token id 32 at position 4"), std::string::npos);
}

TEST(ModelPacking, BackwardBeforeForwardIsRefused) {
  TinyModel model(tiny_config(false, false, false), {8, 2});
  EXPECT_THROW(model.transformer.backward(model.params, model.grads, model.acts, model.acts.logits), std::logic_error);
}

}  // namespace
