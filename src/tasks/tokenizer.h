// What the rest of tandem sees of a tokenizer: text to ids and back.
//
// Two kinds exist: the byte-level BPE of pretrained models (BpeTokenizer, loaded from a
// Hugging Face tokenizer.json) and a character-level one for synthetic tasks
// (CharTokenizer).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Ids of the control tokens a generation loop needs, where the tokenizer defines them.
struct SpecialTokenIds {
  std::optional<int32_t> bos;  // beginning of sequence
  std::optional<int32_t> eos;  // end of sequence (for chat models: end of turn)
  std::optional<int32_t> pad;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ids of UTF-8 text. Special tokens written in the text (such as "<|im_start|>") become
  // their ids. Nothing is added around the text: no BOS, no template.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;

  // The text of a sequence of ids, special tokens included as their text. Throws
  // std::out_of_range naming an id that the tokenizer does not have.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // One past the largest id (the smallest embedding table that fits every id).
  virtual int32_t vocab_size() const = 0;

  // The id of a token given by its text as the tokenizer stores it, or nullopt.
  virtual std::optional<int32_t> find_id(std::string_view token) const = 0;

  virtual const SpecialTokenIds& special_ids() const = 0;

  // Like find_id, but throws std::invalid_argument naming the token when it is missing.
  int32_t id_of(std::string_view token) const;
};

// Loads a Hugging Face tokenizer.json; `path` is the file or the folder that holds it.
// A tokenizer_config.json beside it supplies the bos/eos/pad tokens.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

}  // namespace tandem
