// Parameter slab layout (names, shapes, alignment, tying) and activation memory.
#include <gtest/gtest.h>

#include "model/activations.h"
#include "model/parameters.h"

using namespace tandem;

namespace {

TEST(ModelLayout, Qwen3SmallHasItsPublishedParameterCount) {
  const ParameterLayout layout(ModelConfig::qwen3_0_6b());
  // Qwen3-0.6B: 0.6B parameters, 0.44B without the (tied) embedding.
  EXPECT_EQ(layout.parameter_count(), 596049920);
  EXPECT_EQ(layout.parameter_count() - 151936LL * 1024, 440467456);
  EXPECT_EQ(layout.find("lm_head.weight"), nullptr);
  EXPECT_EQ(layout.tensors().size(), 1 + 28 * 11 + 1u);
}

TEST(ModelLayout, NamesShapesAndOffsetsFollowHuggingFace) {
  ModelConfig config = ModelConfig::qwen3_0_6b();
  config.layers = 1;
  config.vocab = 1000;
  config.tie_embeddings = false;
  config.qkv_bias = true;
  const ParameterLayout layout(config);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {1000, 1024}},
      {"model.layers.0.input_layernorm.weight", {1024}},
      {"model.layers.0.self_attn.q_proj.weight", {2048, 1024}},
      {"model.layers.0.self_attn.q_proj.bias", {2048}},
      {"model.layers.0.self_attn.k_proj.weight", {1024, 1024}},
      {"model.layers.0.self_attn.k_proj.bias", {1024}},
      {"model.layers.0.self_attn.v_proj.weight", {1024, 1024}},
      {"model.layers.0.self_attn.v_proj.bias", {1024}},
      {"model.layers.0.self_attn.q_norm.weight", {128}},
      {"model.layers.0.self_attn.k_norm.weight", {128}},
      {"model.layers.0.self_attn.o_proj.weight", {1024, 2048}},
      {"model.layers.0.post_attention_layernorm.weight", {1024}},
      {"model.layers.0.mlp.gate_proj.weight", {3072, 1024}},
      {"model.layers.0.mlp.up_proj.weight", {3072, 1024}},
      {"model.layers.0.mlp.down_proj.weight", {1024, 3072}},
      {"model.norm.weight", {1024}},
      {"lm_head.weight", {1000, 1024}},
  };
  ASSERT_EQ(layout.tensors().size(), expected.size());
  int64_t end = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const ParameterInfo& info = layout.tensors()[i];
    EXPECT_EQ(info.name, expected[i].first);
    EXPECT_EQ(info.shape, expected[i].second) << info.name;
    EXPECT_EQ(info.offset % ParameterLayout::kAlignment, 0) << info.name;
    EXPECT_GE(info.offset, end) << info.name << " overlaps the tensor before it";
    end = info.offset + info.numel();
  }
  EXPECT_GE(layout.slab_elements(), end);
  EXPECT_LT(layout.slab_elements(), end + ParameterLayout::kAlignment);
}

TEST(ModelLayout, BindGivesViewsIntoTheSlabAndTiesTheHead) {
  ModelConfig config = ModelConfig::qwen3_0_6b();
  config.layers = 2;
  config.vocab = 64;
  config.hidden = 32;
  config.heads = 2;
  config.kv_heads = 1;
  config.head_dim = 8;
  config.intermediate = 48;
  const ParameterLayout layout(config);
  std::vector<uint16_t> slab(layout.slab_elements());
  const ParameterSet set = ParameterSet::bind(layout, slab.data(), DType::BF16);
  EXPECT_EQ(set.lm_head.data, set.embed_tokens.data);
  EXPECT_EQ(set.layers[1].down_proj.data,
            slab.data() + layout.find("model.layers.1.mlp.down_proj.weight")->offset);
  EXPECT_EQ(set.layers[1].down_proj.describe(), "BF16[32,48] cpu");
  EXPECT_EQ(set.layers[0].q_bias.data, nullptr);
  EXPECT_EQ(set["model.layers.0.self_attn.k_norm.weight"].data, set.layers[0].k_norm.data);
  EXPECT_THROW(set["lm_head.weight"], std::out_of_range);
  EXPECT_EQ(layout.slab_bytes(DType::BF16), slab.size() * 2);
}

// The engine's one-GEMM q|k|v and gate|up rest on this: views, no copies, and nothing
// stacked across a bias, an alignment gap or out of layout order.
TEST(ModelLayout, StackedWeightsSeeProjectionsThatLieEndToEndAsOneMatrix) {
  ModelConfig config = ModelConfig::qwen3_0_6b();
  config.layers = 1;
  config.vocab = 64;
  const ParameterLayout layout(config);
  std::vector<uint16_t> slab(layout.slab_elements());
  const LayerParameters p = ParameterSet::bind(layout, slab.data(), DType::BF16).layers[0];
  const Tensor qkv = stacked_weights({p.q_proj, p.k_proj, p.v_proj});
  EXPECT_EQ(qkv.data, p.q_proj.data);
  EXPECT_EQ(qkv.describe(), "BF16[4096,1024] cpu");
  const Tensor gate_up = stacked_weights({p.gate_proj, p.up_proj});
  EXPECT_EQ(gate_up.data, p.gate_proj.data);
  EXPECT_EQ(gate_up.describe(), "BF16[6144,1024] cpu");
  EXPECT_EQ(stacked_weights({p.k_proj, p.q_proj}).data, nullptr);
  EXPECT_EQ(stacked_weights({p.up_proj, p.down_proj}).data, nullptr);  // adjacent, but 1024 vs 3072 wide

  config.qkv_bias = true;
  const ParameterLayout biased(config);
  std::vector<uint16_t> biased_slab(biased.slab_elements());
  const LayerParameters b = ParameterSet::bind(biased, biased_slab.data(), DType::BF16).layers[0];
  EXPECT_EQ(stacked_weights({b.q_proj, b.k_proj, b.v_proj}).data, nullptr);
  EXPECT_NE(stacked_weights({b.gate_proj, b.up_proj}).data, nullptr);

  // q_proj's 8 x 24 elements fill their 64-element alignment, k_proj's 2 x 24 do not: a
  // gap before v_proj.
  config.qkv_bias = false;
  config.hidden = 24;
  config.heads = 4;
  config.kv_heads = 1;
  config.head_dim = 2;
  config.intermediate = 40;
  const ParameterLayout gapped(config);
  std::vector<uint16_t> gapped_slab(gapped.slab_elements());
  const LayerParameters g = ParameterSet::bind(gapped, gapped_slab.data(), DType::BF16).layers[0];
  EXPECT_NE(stacked_weights({g.q_proj, g.k_proj}).data, nullptr);
  EXPECT_EQ(stacked_weights({g.q_proj, g.k_proj, g.v_proj}).data, nullptr);
  EXPECT_NE(stacked_weights({g.gate_proj, g.up_proj}).data, nullptr);  // 40 x 24 = 15 x 64
}

TEST(ModelLayout, InvalidConfigsAreRefusedByField) {
  ModelConfig config = ModelConfig::qwen3_0_6b();
  config.kv_heads = 3;
  try {
    ParameterLayout{config};
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("num_key_value_heads (3)"), std::string::npos) << error.what();
  }
  config = ModelConfig::qwen3_0_6b();
  config.head_dim = 7;
  EXPECT_THROW(ParameterLayout{config}, std::invalid_argument);
}

// The per-token figure documented in model/activations.h, counted independently.
TEST(ModelLayout, ActivationMemoryIsLinearInTokensAsDocumented) {
  const ModelConfig config = ModelConfig::qwen3_0_6b();
  const int64_t C = config.hidden, I = config.intermediate, V = config.vocab, H = config.heads, KV = config.kv_heads;
  const int64_t QD = config.q_dim(), KD = config.kv_dim();
  // q and k twice (before q/k norm, and normed and rotated), gate, up and their SwiGLU product
  const int64_t stored_per_layer = 2 * C + 2 * QD + 3 * KD + QD + 3 * I;
  const int64_t stats_per_layer = 2 + H + (H + KV);  // two RMSNorms, log-sum-exp, q/k norms
  const int64_t scratch = C + 2 * C + 2 * QD + 3 * KD + QD + 3 * I + H;  // H: attention row dots
  const int64_t per_token = config.layers * (stored_per_layer + stats_per_layer) + C + 1 + V + scratch + 2;
  const size_t small = Activations::slab_bytes(config, {1024, 16}, DType::F32);
  const size_t large = Activations::slab_bytes(config, {2048, 16}, DType::F32);
  const int64_t buffers = 4 + config.layers * 17 + 3 + 13;
  EXPECT_NEAR(static_cast<double>(large - small), 1024.0 * per_token * 4, buffers * 256.0);
}

TEST(ModelLayout, ActivationsRefuseAnUnalignedSlabOrNoCapacity) {
  ModelConfig config = ModelConfig::qwen3_0_6b();
  config.layers = 1;
  alignas(256) static std::byte storage[16];
  EXPECT_THROW(Activations::bind(config, {0, 0}, nullptr, DType::F32), std::invalid_argument);
  EXPECT_THROW(Activations::bind(config, {4, 8}, nullptr, DType::F32), std::invalid_argument);
  EXPECT_THROW(Activations::bind(config, {4, 1}, storage + 8, DType::F32), std::invalid_argument);
}

}  // namespace
