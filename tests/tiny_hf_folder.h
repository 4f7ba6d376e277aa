// A small pretrained-model folder in Hugging Face layout for the tests that run the loop
// on one: the Qwen3 fixture's shape (tests/fixtures/model/qwen3) with a vocabulary that
// holds a byte-level BPE tokenizer's 256 bytes and the Qwen3 chat tokens, random weights.
#pragma once
#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/hf_import.h"
#include "support.h"
#include "tasks/byte_level.h"
#include "test_model_support.h"

namespace tandem::testing {

constexpr int32_t kTinyEndOfText = 256, kTinyImStart = 257, kTinyImEnd = 258;

// tokenizer.json: one token per byte (ids 0-255, no merges) and the chat tokens after them;
// tokenizer_config.json names <|im_end|> as eos, generation_config.json both end ids.
inline void write_tiny_hf_tokenizer(const std::filesystem::path& folder) {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& symbols = byte_level::byte_symbols();
  for (int b = 0; b < 256; ++b) vocab[symbols[b]] = b;
  nlohmann::json added = nlohmann::json::array();
  for (const auto& [id, text] : {std::pair{kTinyEndOfText, "<|endoftext|>"}, {kTinyImStart, "<|im_start|>"}, {kTinyImEnd, "<|im_end|>"}})
    added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
  };
  write_text(folder / "tokenizer.json", tokenizer.dump());
  write_text(folder / "tokenizer_config.json", R"({"bos_token": null, "eos_token": "<|im_end|>"})");
  write_text(folder / "generation_config.json", R"({"eos_token_id": [258, 256]})");
}

// config.json, model.safetensors (FP32) and the tokenizer. Returns the model's config.
inline ModelConfig write_tiny_hf_model(const std::filesystem::path& folder, uint32_t seed = 11) {
  ModelConfig config = load_hf_config(source_dir() / "tests/fixtures/model/qwen3");
  config.vocab = 272;
  TinyModel model(config, {16, 1}, seed);
  export_hf(folder, model.params, DType::F32);
  write_tiny_hf_tokenizer(folder);
  return config;
}

}  // namespace tandem::testing
