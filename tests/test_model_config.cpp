// Reading Hugging Face config.json files (published ones, both RoPE spellings) and the
// errors for what tandem does not implement.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "model/config.h"

using namespace tandem;

namespace {

// Qwen/Qwen3-0.6B as published (transformers 4.51 spelling: top-level rope_theta).
const char* kQwen3Classic = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// The same model as transformers 5 writes it: theta inside rope_parameters.
const char* kQwen3Parameters = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
  "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 16,
  "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "layer_types": ["full_attention", "full_attention"],
  "tie_word_embeddings": true, "dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})";

// meta-llama/Llama-3.2-1B as published.
const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

// Qwen/Qwen2.5-0.5B as published: no head_dim key, q/k/v biases implied.
const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936})";

std::string edited(const char* text, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json root = nlohmann::json::parse(text);
  edit(root);
  return root.dump();
}

std::string error_of(const std::string& text) {
  try {
    ModelConfig::from_hf_json_text(text, "/models/x/config.json");
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "accepted";
}

TEST(ModelConfig, ReadsQwen3InBothRopeSpellings) {
  for (const char* text : {kQwen3Classic, kQwen3Parameters}) {
    const ModelConfig config = ModelConfig::from_hf_json_text(text, "config.json");
    EXPECT_EQ(config.arch, Architecture::Qwen3);
    EXPECT_EQ(config.layers, 28);
    EXPECT_EQ(config.hidden, 1024);
    EXPECT_EQ(config.heads, 16);
    EXPECT_EQ(config.kv_heads, 8);
    EXPECT_EQ(config.head_dim, 128);
    EXPECT_EQ(config.intermediate, 3072);
    EXPECT_EQ(config.vocab, 151936);
    EXPECT_EQ(config.rope_theta, 1e6);
    EXPECT_FALSE(config.rope_scaling.enabled);
    EXPECT_EQ(config.rms_eps, 1e-6);
    EXPECT_TRUE(config.qk_norm);
    EXPECT_FALSE(config.qkv_bias);
    EXPECT_TRUE(config.tie_embeddings);
    EXPECT_EQ(config.max_position, 40960);
  }
}

TEST(ModelConfig, ReadsLlama3WithItsRopeScaling) {
  const ModelConfig config = ModelConfig::from_hf_json_text(kLlama32, "config.json");
  EXPECT_EQ(config.arch, Architecture::Llama);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.rms_eps, 1e-5);
  EXPECT_EQ(config.rope_theta, 500000);
  ASSERT_TRUE(config.rope_scaling.enabled);
  EXPECT_EQ(config.rope_scaling.factor, 32);
  EXPECT_EQ(config.rope_scaling.original_max_position, 8192);

  const std::vector<float> inv_freq = config.rope_inv_freq();
  ASSERT_EQ(inv_freq.size(), 32u);
  // Wavelength 2π < 8192/4: kept. Wavelength > 8192: divided by 32. Index 16 has
  // wavelength 2π·707.1 = 4442.9, inside the band: blended with weight
  // (8192/4442.9 − 1)/3 = 0.28129 on the unscaled frequency.
  EXPECT_FLOAT_EQ(inv_freq[0], 1.0f);
  EXPECT_NEAR(inv_freq[31], std::pow(500000.0, -62.0 / 64) / 32, 1e-6 * inv_freq[31]);
  const double base16 = 1 / std::sqrt(500000.0);
  EXPECT_NEAR(inv_freq[16], base16 * (0.71871 / 32 + 0.28129), 1e-4 * inv_freq[16]);
}

TEST(ModelConfig, ReadsQwen2WithBiasesAndDerivedHeadDim) {
  const ModelConfig config = ModelConfig::from_hf_json_text(kQwen25, "config.json");
  EXPECT_EQ(config.arch, Architecture::Qwen2);
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.kv_heads, 2);
}

TEST(ModelConfig, RopeFrequenciesFollowTheta) {
  ModelConfig config = ModelConfig::from_hf_json_text(kQwen25, "config.json");
  const std::vector<float> inv_freq = config.rope_inv_freq();
  ASSERT_EQ(inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(inv_freq[i], std::pow(1e6, -i / 32.0), 1e-6 * inv_freq[i]) << i;
}

TEST(ModelConfig, UnsupportedContentIsNamedWithFileAndKey) {
  using nlohmann::json;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {edited(kQwen3Classic, [](json& j) { j["architectures"] = {"MistralForCausalLM"}; }),
       "key 'architectures' names 'MistralForCausalLM'"},
      {edited(kLlama32, [](json& j) { j["rope_scaling"]["rope_type"] = "yarn"; }),
       "key 'rope_scaling.rope_type' is 'yarn'"},
      {edited(kQwen3Parameters, [](json& j) { j["rope_parameters"]["rope_type"] = "dynamic"; }),
       "key 'rope_parameters.rope_type' is 'dynamic'"},
      {edited(kLlama32, [](json& j) { j["rope_scaling"].erase("low_freq_factor"); }),
       "key 'rope_scaling.low_freq_factor' is missing"},
      {edited(kQwen3Classic, [](json& j) { j["hidden_act"] = "gelu"; }), "key 'hidden_act' is 'gelu'"},
      {edited(kLlama32, [](json& j) { j["attention_bias"] = true; }), "key 'attention_bias' is true"},
      {edited(kLlama32, [](json& j) { j["mlp_bias"] = true; }), "key 'mlp_bias' is true"},
      {edited(kQwen25, [](json& j) { j["use_sliding_window"] = true; }), "key 'use_sliding_window' is true"},
      {edited(kQwen3Parameters, [](json& j) { j["layer_types"][1] = "sliding_attention"; }),
       "key 'layer_types' contains \"sliding_attention\""},
      {edited(kQwen3Classic, [](json& j) { j["partial_rotary_factor"] = 0.5; }), "key 'partial_rotary_factor'"},
      {edited(kQwen3Classic, [](json& j) { j.erase("hidden_size"); }), "key 'hidden_size' is missing"},
      {edited(kQwen3Classic, [](json& j) { j["num_hidden_layers"] = 2.5; }),
       "key 'num_hidden_layers' must be an integer"},
      {edited(kQwen3Classic, [](json& j) { j["num_key_value_heads"] = 5; }), "num_key_value_heads (5)"},
      {edited(kQwen25, [](json& j) { j["hidden_size"] = 900; }), "key 'head_dim' is missing"},
      {"{\"architectures\": [", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = error_of(text);
    EXPECT_NE(message.find("/models/x/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << "wanted '" << expected << "' in: " << message;
  }
}

TEST(ModelConfig, MissingFileIsNamed) {
  try {
    ModelConfig::from_hf_json("/nonexistent/tandem/config.json");
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/tandem/config.json"), std::string::npos);
  }
}

TEST(ModelConfig, WritesBackWhatItReadsAndKeepsOtherKeys) {
  for (const char* text : {kQwen3Classic, kQwen3Parameters, kLlama32, kQwen25}) {
    const ModelConfig config = ModelConfig::from_hf_json_text(text, "in.json");
    const std::string written = config.to_hf_json("BF16");
    const ModelConfig again = ModelConfig::from_hf_json_text(written, "out.json");
    EXPECT_EQ(again.arch, config.arch);
    EXPECT_EQ(again.layers, config.layers);
    EXPECT_EQ(again.hidden, config.hidden);
    EXPECT_EQ(again.heads, config.heads);
    EXPECT_EQ(again.kv_heads, config.kv_heads);
    EXPECT_EQ(again.head_dim, config.head_dim);
    EXPECT_EQ(again.intermediate, config.intermediate);
    EXPECT_EQ(again.vocab, config.vocab);
    EXPECT_EQ(again.rope_theta, config.rope_theta);
    EXPECT_EQ(again.rope_scaling.enabled, config.rope_scaling.enabled);
    EXPECT_EQ(again.rope_scaling.factor, config.rope_scaling.factor);
    EXPECT_EQ(again.rms_eps, config.rms_eps);
    EXPECT_EQ(again.qk_norm, config.qk_norm);
    EXPECT_EQ(again.qkv_bias, config.qkv_bias);
    EXPECT_EQ(again.tie_embeddings, config.tie_embeddings);
    EXPECT_EQ(again.max_position, config.max_position);
    const nlohmann::json root = nlohmann::json::parse(written);
    EXPECT_EQ(root.at("dtype"), "bfloat16");
    EXPECT_FALSE(root.contains("torch_dtype"));
    EXPECT_TRUE(root.contains("bos_token_id"));  // not modelled, carried through
    EXPECT_EQ(root.at("rope_parameters").at("rope_theta"), root.at("rope_theta"));
  }
}

TEST(ModelConfig, RefusesToWriteSwitchesNoArchitectureHas) {
  ModelConfig config = ModelConfig::from_hf_json_text(kQwen3Classic, "in.json");
  config.qkv_bias = true;
  EXPECT_THROW(config.to_hf_json("F32"), std::invalid_argument);
  config.qkv_bias = false;
  EXPECT_THROW(config.to_hf_json("I8"), std::invalid_argument);
}

}  // namespace
