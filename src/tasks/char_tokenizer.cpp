#include "tasks/char_tokenizer.h"

#include <stdexcept>

#include "tasks/utf8_text.h"

namespace tandem {

CharTokenizer::CharTokenizer(std::string_view alphabet, std::vector<std::string> special_tokens)
    : special_count_(special_tokens.size()) {
  utf8::check_valid(alphabet, "character tokenizer alphabet");
  const auto add = [&](std::string token) {
    const auto id = static_cast<int32_t>(tokens_.size());
    if (token.empty() || !ids_.emplace(token, id).second) {
      throw std::invalid_argument("character tokenizer: token '" + token +
                                  "' is empty or given twice");
    }
    tokens_.push_back(std::move(token));
  };
  for (std::string& token : special_tokens) add(std::move(token));
  for (std::size_t pos = 0; pos < alphabet.size();) {
    const std::size_t start = pos;
    utf8::next_code_point(alphabet, pos);
    add(std::string(alphabet.substr(start, pos - start)));
  }
  special_ids_.pad = find_id("<pad>");
  special_ids_.bos = find_id("<bos>");
  special_ids_.eos = find_id("<eos>");
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  utf8::check_valid(text, "text to tokenize");
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    int32_t special = -1;
    std::size_t special_length = 0;
    for (std::size_t id = 0; id < special_count_; ++id) {
      const std::string& token = tokens_[id];
      if (token.size() > special_length && text.substr(pos).starts_with(token)) {
        special = static_cast<int32_t>(id);
        special_length = token.size();
      }
    }
    if (special >= 0) {
      ids.push_back(special);
      pos += special_length;
      continue;
    }
    const std::size_t start = pos;
    const char32_t code_point = utf8::next_code_point(text, pos);
    const auto found = ids_.find(text.substr(start, pos - start));
    if (found == ids_.end()) {
      throw std::invalid_argument("character '" + std::string(text.substr(start, pos - start)) +
                                  "' (" + utf8::code_point_name(code_point) + ") at byte offset " +
                                  std::to_string(start) +
                                  " is not in the character tokenizer's alphabet");
    }
    ids.push_back(found->second);
  }
  return ids;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("cannot decode token id " + std::to_string(id) +
                              ": the character tokenizer has ids 0 to " +
                              std::to_string(vocab_size() - 1));
    }
    text += tokens_[id];
  }
  return text;
}

std::optional<int32_t> CharTokenizer::find_id(std::string_view token) const {
  const auto found = ids_.find(token);
  if (found == ids_.end()) return std::nullopt;
  return found->second;
}

}  // namespace tandem
