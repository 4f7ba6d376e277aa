// The shape of a dense decoder (Qwen3, Qwen2, Llama 3). The three families differ only by
// switches: q/k RMSNorm (Qwen3), bias on the q/k/v projections (Qwen2), tied LM head,
// and the RoPE frequencies (theta, optional Llama 3 scaling).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem {

enum class Architecture { Qwen3, Qwen2, Llama };
const char* architecture_hf_name(Architecture arch);  // "Qwen3ForCausalLM", ...

// Llama 3 "llama3" rope type: long wavelengths are stretched by `factor`, short ones
// kept, the band between interpolated. Off (factor 1) for the "default" rope type.
struct Llama3RopeScaling {
  bool enabled = false;
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::Qwen3;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;  // independent of hidden / heads (Qwen3-0.6B: 1024 hidden, 16 x 128)
  int intermediate = 0;
  int vocab = 0;
  double rope_theta = 10000;
  Llama3RopeScaling rope_scaling;
  double rms_eps = 1e-6;
  bool qk_norm = false;
  bool qkv_bias = false;
  bool tie_embeddings = false;
  int64_t max_position = 4096;
  // The config.json text this config was read from (empty when built in code). Export
  // starts from it, so keys tandem does not model (token ids, ...) survive a round trip.
  std::string hf_source;

  // Reads a Hugging Face config.json. Accepts rope_theta at the top level or inside
  // rope_parameters / rope_scaling. Throws std::runtime_error naming the file and the key
  // for unsupported architectures, rope types, activations or layouts.
  static ModelConfig from_hf_json(const std::filesystem::path& path);
  static ModelConfig from_hf_json_text(const std::string& text, const std::string& origin);
  // The Qwen3-0.6B shape (tied embeddings, q/k norm), with `layers` of its 28: what the
  // benchmarks measure and the layout tests count.
  static ModelConfig qwen3_0_6b(int layers = 28);

  // config.json for transformers >= 5 (rope_parameters) that older versions also read
  // (top-level rope_theta). `dtype` is the safetensors code of the exported weights.
  std::string to_hf_json(const std::string& dtype) const;

  // Throws std::invalid_argument naming the first inconsistent field.
  void validate() const;

  int q_dim() const { return heads * head_dim; }
  int kv_dim() const { return kv_heads * head_dim; }
  // RoPE inverse frequencies, head_dim / 2 of them, with the Llama 3 scaling applied.
  std::vector<float> rope_inv_freq() const;
};

}  // namespace tandem
