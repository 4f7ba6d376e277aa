#include "model/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>
#include <stdexcept>

namespace tandem {

using nlohmann::json;

const char* architecture_hf_name(Architecture arch) {
  switch (arch) {
    case Architecture::Qwen3: return "Qwen3ForCausalLM";
    case Architecture::Qwen2: return "Qwen2ForCausalLM";
    case Architecture::Llama: return "LlamaForCausalLM";
  }
  throw std::invalid_argument("invalid Architecture value " + std::to_string(static_cast<int>(arch)));
}

namespace {

const char* model_type(Architecture arch) {
  switch (arch) {
    case Architecture::Qwen3: return "qwen3";
    case Architecture::Qwen2: return "qwen2";
    case Architecture::Llama: return "llama";
  }
  return "";
}

// Reads typed keys of one JSON object and names the file and the key in every error.
class Reader {
 public:
  Reader(const json& object, std::string origin, std::string prefix = "")
      : object_(object), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw std::runtime_error(origin_ + ": key '" + prefix_ + key + "' " + why);
  }
  bool has(const std::string& key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  int64_t integer(const std::string& key) const {
    if (!has(key)) fail(key, "is missing");
    const json& value = object_.at(key);
    if (!value.is_number_integer()) fail(key, "must be an integer, got " + value.dump());
    return value.get<int64_t>();
  }
  int64_t integer(const std::string& key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double number(const std::string& key) const {
    if (!has(key)) fail(key, "is missing");
    const json& value = object_.at(key);
    if (!value.is_number()) fail(key, "must be a number, got " + value.dump());
    return value.get<double>();
  }
  double number(const std::string& key, double fallback) const { return has(key) ? number(key) : fallback; }

  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_boolean()) fail(key, "must be true or false, got " + value.dump());
    return value.get<bool>();
  }

  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_string()) fail(key, "must be a string, got " + value.dump());
    return value.get<std::string>();
  }

 private:
  const json& object_;
  std::string origin_;
  std::string prefix_;
};

Architecture parse_architecture(const json& root, const Reader& reader) {
  if (!root.contains("architectures") || !root.at("architectures").is_array() || root.at("architectures").empty() ||
      !root.at("architectures")[0].is_string())
    reader.fail("architectures", "must be a non-empty list of class names");
  const std::string name = root.at("architectures")[0].get<std::string>();
  for (Architecture arch : {Architecture::Qwen3, Architecture::Qwen2, Architecture::Llama})
    if (name == architecture_hf_name(arch)) return arch;
  reader.fail("architectures", "names '" + name +
                                   "', which tandem does not support (Qwen3ForCausalLM, Qwen2ForCausalLM, "
                                   "LlamaForCausalLM)");
}

// transformers >= 5 writes `rope_parameters` (theta inside); older files have a top-level
// `rope_theta` and an optional `rope_scaling`. Both can also be nested per layer type.
void parse_rope(const json& root, const Reader& top, const std::string& origin, ModelConfig& config) {
  const char* key = root.contains("rope_parameters") && !root.at("rope_parameters").is_null() ? "rope_parameters"
                                                                                               : "rope_scaling";
  json rope = root.contains(key) && !root.at(key).is_null() ? root.at(key) : json::object();
  if (!rope.is_object()) top.fail(key, "must be an object, got " + rope.dump());
  std::string prefix = std::string(key) + ".";
  if (rope.contains("full_attention") && rope.at("full_attention").is_object()) {
    rope = rope.at("full_attention");
    prefix += "full_attention.";
  }
  const Reader reader(rope, origin, prefix);

  config.rope_theta = reader.number("rope_theta", top.number("rope_theta", 10000.0));
  const Reader& partial_source = reader.has("partial_rotary_factor") ? reader : top;
  const double partial = partial_source.number("partial_rotary_factor", 1.0);
  if (partial != 1.0)
    partial_source.fail("partial_rotary_factor", "is " + std::to_string(partial) + "; tandem rotates whole heads only");

  const std::string type = reader.string("rope_type", reader.string("type", "default"));
  if (type == "llama3") {
    config.rope_scaling.enabled = true;
    config.rope_scaling.factor = reader.number("factor");
    config.rope_scaling.low_freq_factor = reader.number("low_freq_factor");
    config.rope_scaling.high_freq_factor = reader.number("high_freq_factor");
    config.rope_scaling.original_max_position =
        reader.integer("original_max_position_embeddings", top.integer("original_max_position_embeddings", config.max_position));
  } else if (type != "default") {
    reader.fail("rope_type", "is '" + type + "', which tandem does not implement (default, llama3)");
  }
}

}  // namespace

ModelConfig ModelConfig::qwen3_0_6b(int layers) {
  ModelConfig config;
  config.arch = Architecture::Qwen3;
  config.layers = layers;
  config.hidden = 1024;
  config.heads = 16;
  config.kv_heads = 8;
  config.head_dim = 128;
  config.intermediate = 3072;
  config.vocab = 151936;
  config.rope_theta = 1000000;
  config.rms_eps = 1e-6;
  config.qk_norm = true;
  config.tie_embeddings = true;
  config.max_position = 40960;
  return config;
}

ModelConfig ModelConfig::from_hf_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open the model config");
  std::stringstream text;
  text << in.rdbuf();
  return from_hf_json_text(text.str(), path.string());
}

ModelConfig ModelConfig::from_hf_json_text(const std::string& text, const std::string& origin) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& error) {
    throw std::runtime_error(origin + ": not valid JSON (" + error.what() + ")");
  }
  if (!root.is_object()) throw std::runtime_error(origin + ": a model config must be a JSON object");
  const Reader reader(root, origin);

  ModelConfig config;
  config.hf_source = text;
  config.arch = parse_architecture(root, reader);
  config.layers = static_cast<int>(reader.integer("num_hidden_layers"));
  config.hidden = static_cast<int>(reader.integer("hidden_size"));
  config.heads = static_cast<int>(reader.integer("num_attention_heads"));
  config.kv_heads = static_cast<int>(reader.integer("num_key_value_heads", config.heads));
  if (!reader.has("head_dim") && (config.heads <= 0 || config.hidden % config.heads != 0))
    reader.fail("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
  config.head_dim = static_cast<int>(reader.integer("head_dim", config.heads > 0 ? config.hidden / config.heads : 0));
  config.intermediate = static_cast<int>(reader.integer("intermediate_size"));
  config.vocab = static_cast<int>(reader.integer("vocab_size"));
  config.rms_eps = reader.number("rms_norm_eps", 1e-6);
  config.tie_embeddings = reader.boolean("tie_word_embeddings", false);
  config.max_position = reader.integer("max_position_embeddings", config.arch == Architecture::Llama ? 2048 : 32768);
  parse_rope(root, reader, origin, config);

  const std::string activation = reader.string("hidden_act", "silu");
  if (activation != "silu") reader.fail("hidden_act", "is '" + activation + "'; tandem implements the SwiGLU MLP (silu)");
  if (reader.boolean("mlp_bias", false)) reader.fail("mlp_bias", "is true; tandem's MLP has no bias");
  if (reader.boolean("use_sliding_window", false))
    reader.fail("use_sliding_window", "is true; tandem implements full causal attention only");
  if (root.contains("layer_types") && root.at("layer_types").is_array())
    for (const json& type : root.at("layer_types"))
      if (type != "full_attention")
        reader.fail("layer_types", "contains " + type.dump() + "; tandem implements full causal attention only");

  // Qwen2 always has q/k/v biases; Llama and Qwen3 put `attention_bias` on o_proj too.
  config.qk_norm = config.arch == Architecture::Qwen3;
  config.qkv_bias = config.arch == Architecture::Qwen2;
  if (config.arch != Architecture::Qwen2 && reader.boolean("attention_bias", false))
    reader.fail("attention_bias", "is true (bias on q/k/v/o_proj), which tandem does not implement");

  try {
    config.validate();
  } catch (const std::invalid_argument& error) {
    throw std::runtime_error(origin + ": " + error.what());
  }
  return config;
}

void ModelConfig::validate() const {
  auto positive = [](const char* name, int64_t value) {
    if (value <= 0) throw std::invalid_argument(std::string(name) + " must be positive, got " + std::to_string(value));
  };
  positive("num_hidden_layers", layers);
  positive("hidden_size", hidden);
  positive("num_attention_heads", heads);
  positive("num_key_value_heads", kv_heads);
  positive("head_dim", head_dim);
  positive("intermediate_size", intermediate);
  positive("vocab_size", vocab);
  positive("max_position_embeddings", max_position);
  if (heads % kv_heads != 0)
    throw std::invalid_argument("num_attention_heads (" + std::to_string(heads) +
                                ") must be a multiple of num_key_value_heads (" + std::to_string(kv_heads) + ")");
  if (head_dim % 2 != 0) throw std::invalid_argument("head_dim must be even for RoPE, got " + std::to_string(head_dim));
  if (!(rope_theta > 0)) throw std::invalid_argument("rope_theta must be positive, got " + std::to_string(rope_theta));
  if (!(rms_eps > 0)) throw std::invalid_argument("rms_norm_eps must be positive, got " + std::to_string(rms_eps));
  if (rope_scaling.enabled &&
      (!(rope_scaling.factor > 0) || !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
       !(rope_scaling.low_freq_factor > 0) || rope_scaling.original_max_position <= 0))
    throw std::invalid_argument(
        "llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
        "original_max_position_embeddings > 0");
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  // Same arithmetic as transformers: the base frequencies in FP32, the Llama 3 blend on top.
  std::vector<float> inv_freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(rope_theta), exponent);
  }
  if (!rope_scaling.enabled) return inv_freq;
  const auto& s = rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  for (float& freq : inv_freq) {
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen > low_freq_wavelen) {
      freq = static_cast<float>(freq / s.factor);
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      freq = static_cast<float>((1 - smooth) * freq / s.factor + smooth * freq);
    }
  }
  return inv_freq;
}

std::string ModelConfig::to_hf_json(const std::string& dtype) const {
  validate();
  const bool representable = (arch == Architecture::Qwen3 && qk_norm && !qkv_bias) ||
                             (arch == Architecture::Qwen2 && !qk_norm && qkv_bias) ||
                             (arch == Architecture::Llama && !qk_norm && !qkv_bias);
  if (!representable)
    throw std::invalid_argument(std::string("cannot write a config.json for ") + architecture_hf_name(arch) +
                                " with qk_norm=" + (qk_norm ? "true" : "false") +
                                " and qkv_bias=" + (qkv_bias ? "true" : "false") +
                                " (Qwen3 has q/k norm, Qwen2 has q/k/v bias, Llama has neither)");
  const char* torch_dtype = dtype == "F32" ? "float32" : dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : nullptr;
  if (!torch_dtype) throw std::invalid_argument("cannot export model weights as dtype '" + dtype + "' (F32, BF16, F16)");

  json root = hf_source.empty() ? json::object() : json::parse(hf_source);
  root.erase("rope_scaling");
  root.erase("torch_dtype");
  root["architectures"] = {architecture_hf_name(arch)};
  root["model_type"] = model_type(arch);
  root["num_hidden_layers"] = layers;
  root["hidden_size"] = hidden;
  root["num_attention_heads"] = heads;
  root["num_key_value_heads"] = kv_heads;
  root["head_dim"] = head_dim;
  root["intermediate_size"] = intermediate;
  root["vocab_size"] = vocab;
  root["max_position_embeddings"] = max_position;
  root["rms_norm_eps"] = rms_eps;
  root["hidden_act"] = "silu";
  root["tie_word_embeddings"] = tie_embeddings;
  root["rope_theta"] = rope_theta;
  json rope = {{"rope_type", rope_scaling.enabled ? "llama3" : "default"}, {"rope_theta", rope_theta}};
  if (rope_scaling.enabled) {
    rope["factor"] = rope_scaling.factor;
    rope["low_freq_factor"] = rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = rope_scaling.original_max_position;
  }
  root["rope_parameters"] = rope;
  if (arch != Architecture::Qwen2) root["attention_bias"] = false;
  if (arch == Architecture::Llama) root["mlp_bias"] = false;
  if (arch != Architecture::Llama) root["use_sliding_window"] = false;
  root["dtype"] = torch_dtype;
  return root.dump(2) + "\n";
}

}  // namespace tandem
