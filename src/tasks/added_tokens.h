// Added tokens (special tokens such as <|im_start|> and user-added ones): found in the
// text before anything else, so they are never split by the pre-tokenizer or BPE.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  // only match where no word character touches either side
  bool lstrip = false;       // swallow the white space on its left
  bool rstrip = false;       // swallow the white space on its right
  bool normalized = true;    // matched in the normalised text rather than the raw text
  bool special = true;       // a control token (end of turn...), not text
};

// One stretch of the input: an added token's id, or text still to be tokenized.
struct TextPiece {
  std::string_view text;
  int32_t added_id = -1;  // -1: plain text
};

// Finds a set of added tokens the way Hugging Face does: leftmost-longest matches, then
// the single_word, lstrip and rstrip rules.
class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text to find for `tokens[i]` (its content, normalised or not).
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  // Splits `text` into pieces that concatenate back to it.
  std::vector<TextPiece> split(std::string_view text) const;

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  // For each first byte, the patterns that start with it, longest first.
  std::vector<std::vector<std::size_t>> by_first_byte_;
};

}  // namespace tandem
