#include "driver/model_from_deck.h"

#include <filesystem>

#include "model/hf_import.h"
#include "model/initial_weights.h"

namespace tandem {

namespace {

// A deck may name a folder that only the compute nodes see, so --check leaves it alone;
// the start-up names what is missing before anything is read.
void require_model_folder(const Deck& deck, const std::filesystem::path& folder) {
  const auto fail = [&](const std::string& reason) { throw DeckError(deck.source("model.path"), "model.path", reason); };
  if (!std::filesystem::is_directory(folder))
    fail("'" + folder.string() + "' is not a folder: expected a Hugging Face model folder");
  for (const char* file : {"config.json", "tokenizer.json"})
    if (!std::filesystem::is_regular_file(folder / file)) fail("missing file " + (folder / file).string());
  if (!std::filesystem::is_regular_file(folder / "model.safetensors") &&
      !std::filesystem::is_regular_file(folder / "model.safetensors.index.json"))
    fail("no weights in '" + folder.string() + "': expected model.safetensors or model.safetensors.index.json");
}

}  // namespace

ModelConfig model_config_from_deck(const Deck& deck) {
  const std::string path = deck.get<std::string>("model.path");
  if (!path.empty()) {
    require_model_folder(deck, path);
    return ModelConfig::from_hf_json(std::filesystem::path(path) / "config.json");
  }
  ModelConfig config;
  config.arch = Architecture::Qwen3;
  config.layers = static_cast<int>(deck.get<int64_t>("model.layers"));
  config.hidden = static_cast<int>(deck.get<int64_t>("model.hidden"));
  config.heads = static_cast<int>(deck.get<int64_t>("model.heads"));
  config.kv_heads = static_cast<int>(deck.get<int64_t>("model.kv-heads"));
  config.head_dim = static_cast<int>(deck.get<int64_t>("model.head-dim"));
  config.intermediate = static_cast<int>(deck.get<int64_t>("model.intermediate"));
  config.vocab = static_cast<int>(deck.get<int64_t>("model.vocab"));
  config.rope_theta = deck.get<double>("model.rope-theta");
  config.rms_eps = deck.get<double>("model.rms-eps");
  config.qk_norm = deck.get<bool>("model.qk-norm");
  config.tie_embeddings = deck.get<bool>("model.tie-embeddings");
  config.validate();
  return config;
}

DType working_dtype_from_deck(const Deck& deck, Device device) {
  // The CPU backend is the FP32 reference whatever the deck says.
  if (device == Device::CPU) return DType::F32;
  return deck.get<std::string>("model.dtype") == "bf16" ? DType::BF16 : DType::F32;
}

std::vector<float> initial_weights_from_deck(const Deck& deck, const ParameterLayout& layout) {
  return initial_weights(layout, deck.get<std::string>("model.path"), static_cast<uint64_t>(deck.get<int64_t>("run.seed")));
}

}  // namespace tandem
