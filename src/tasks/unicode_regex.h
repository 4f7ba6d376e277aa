// A compiled Unicode regular expression for tokenizer split patterns.
//
// Backed by Oniguruma, the engine Hugging Face tokenizers itself uses, with the same
// syntax and options, so \p{L}, \s, (?i:...) and lookaheads mean exactly what they mean
// there. std::regex knows none of these.
#pragma once
#include <string>
#include <string_view>
#include <vector>

struct re_pattern_buffer;  // Oniguruma's compiled regex (regex_t)

namespace tandem {

class UnicodeRegex {
 public:
  // Throws std::invalid_argument with Oniguruma's message when the pattern is invalid.
  explicit UnicodeRegex(const std::string& pattern);
  ~UnicodeRegex();
  UnicodeRegex(UnicodeRegex&& other) noexcept;
  UnicodeRegex& operator=(UnicodeRegex&&) = delete;
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Appends to `pieces` every match in valid UTF-8 `text` and every non-empty gap between
  // matches, in order, so that the pieces concatenate back to `text` (the "Isolated" split
  // behaviour). Safe to call from several threads at once.
  void split_isolated(std::string_view text, std::vector<std::string_view>& pieces) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  re_pattern_buffer* regex_;
};

}  // namespace tandem
