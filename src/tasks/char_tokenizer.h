// A character-level tokenizer for synthetic tasks: every character of a fixed alphabet is
// one token, and a few special tokens ("<pad>", "<bos>", "<eos>") are written literally.
#pragma once
#include "tasks/string_map.h"
#include "tasks/tokenizer.h"

namespace tandem {

class CharTokenizer final : public Tokenizer {
 public:
  // Ids: the special tokens first, in the order given, then the alphabet's characters
  // (UTF-8) in order. Throws std::invalid_argument for a repeated character or token.
  // "<pad>", "<bos>" and "<eos>" among the special tokens become special_ids().
  explicit CharTokenizer(std::string_view alphabet,
                         std::vector<std::string> special_tokens = {"<pad>", "<bos>", "<eos>"});

  // Throws std::invalid_argument naming a character outside the alphabet and its position.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  std::optional<int32_t> find_id(std::string_view token) const override;
  const SpecialTokenIds& special_ids() const override { return special_ids_; }

 private:
  std::vector<std::string> tokens_;  // text of each id
  StringMap<int32_t> ids_;           // id of each text
  std::size_t special_count_;
  SpecialTokenIds special_ids_;
};

}  // namespace tandem
