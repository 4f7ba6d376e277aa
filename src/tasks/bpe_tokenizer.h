// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2, Llama 3,
// Qwen2/3 families), giving the same ids as the `tokenizers` library's
// encode(text, add_special_tokens=False) and the same text as its
// decode(ids, skip_special_tokens=False).
//
// The pipeline, in Hugging Face's order:
//   1. added tokens that match the raw text are cut out (longest match first);
//   2. the rest is normalised (NFC or nothing), then normalised added tokens are cut out;
//   3. the pre-tokenizer splits the text with its regexes (Split, ByteLevel use_regex);
//   4. each piece's bytes are merged by BPE rank into vocabulary ids.
// A post-processor (BOS insertion, templates) is never applied, nor are the file's
// truncation and padding settings: callers build sequences explicitly.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tasks/added_tokens.h"
#include "tasks/bpe_model.h"
#include "tasks/tokenizer.h"
#include "tasks/unicode_regex.h"

namespace tandem {

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws std::runtime_error naming the file and the component for anything it cannot
  // honour exactly (another normaliser, a WordPiece model, a Metaspace decoder...).
  // `tokenizer_config` (tokenizer_config.json) names the bos/eos/pad tokens.
  BpeTokenizer(const std::filesystem::path& tokenizer_json,
               const std::optional<std::filesystem::path>& tokenizer_config);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_bytes_.size()); }
  std::optional<int32_t> find_id(std::string_view token) const override;
  const SpecialTokenIds& special_ids() const override { return special_ids_; }

 private:
  // Steps 3 and 4 for text holding no added token.
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;

  bool nfc_ = false;
  std::vector<UnicodeRegex> split_regexes_;  // the Split pre-tokenizers, in order
  bool add_prefix_space_ = false;            // ByteLevel's option
  std::optional<UnicodeRegex> byte_level_regex_;  // ByteLevel with use_regex: GPT-2's split
  std::unique_ptr<BpeModel> model_;
  StringMap<int32_t> added_ids_;
  std::unique_ptr<AddedTokenMatcher> raw_added_;
  std::unique_ptr<AddedTokenMatcher> normalized_added_;
  std::vector<std::optional<std::string>> id_bytes_;  // what decode emits for each id
  SpecialTokenIds special_ids_;
};

}  // namespace tandem
