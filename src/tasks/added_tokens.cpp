#include "tasks/added_tokens.h"

#include <algorithm>
#include <stdexcept>

#include "tasks/utf8_text.h"

namespace tandem {
namespace {

// Start of the code point that ends at `end` (exclusive) in valid UTF-8.
std::size_t previous_start(std::string_view text, std::size_t end) {
  std::size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

char32_t code_point_before(std::string_view text, std::size_t end) {
  std::size_t start = previous_start(text, end);
  return utf8::next_code_point(text, start);
}

char32_t code_point_at(std::string_view text, std::size_t pos) {
  return utf8::next_code_point(text, pos);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)), by_first_byte_(256) {
  if (tokens_.size() != patterns_.size()) {
    throw std::invalid_argument("AddedTokenMatcher: one pattern per token is needed");
  }
  for (std::size_t i = 0; i < patterns_.size(); ++i) {
    if (patterns_[i].empty()) {
      throw std::invalid_argument("added token " + std::to_string(tokens_[i].id) +
                                  " has empty content");
    }
    by_first_byte_[static_cast<unsigned char>(patterns_[i][0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](std::size_t a, std::size_t b) {
      return patterns_[a].size() > patterns_[b].size();
    });
  }
}

std::vector<TextPiece> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextPiece> pieces;
  if (tokens_.empty()) {
    if (!text.empty()) pieces.push_back({text, -1});
    return pieces;
  }
  std::size_t emitted = 0;  // end of the text already covered by pieces
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[pos])];
    const auto found = std::find_if(bucket.begin(), bucket.end(), [&](std::size_t i) {
      return text.substr(pos).starts_with(patterns_[i]);
    });
    if (found == bucket.end()) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[*found];
    std::size_t start = pos;
    std::size_t stop = pos + patterns_[*found].size();
    pos = stop;

    if (token.single_word) {
      const bool word_before = start > 0 && utf8::is_word_character(code_point_before(text, start));
      const bool word_after =
          stop < text.size() && utf8::is_word_character(code_point_at(text, stop));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      while (start > emitted && utf8::is_white_space(code_point_before(text, start))) {
        start = previous_start(text, start);
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        std::size_t next = stop;
        if (!utf8::is_white_space(utf8::next_code_point(text, next))) break;
        stop = next;
      }
      pos = stop;
    }
    if (start > emitted) pieces.push_back({text.substr(emitted, start - emitted), -1});
    pieces.push_back({text.substr(start, stop - start), token.id});
    emitted = stop;
  }
  if (emitted < text.size()) pieces.push_back({text.substr(emitted), -1});
  return pieces;
}

}  // namespace tandem
