#include "tasks/answer_extraction.h"

#include <charconv>

namespace tandem {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Whether a '-' just before text[start] is the number's sign rather than a subtraction
// ("x = -3" is minus three; "10-3" ends with three).
bool is_sign(std::string_view text, size_t start) {
  if (start == 0 || text[start - 1] != '-') return false;
  if (start == 1) return true;
  const char before = text[start - 2];
  return !(is_digit(before) || before == ')' || (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z'));
}

// The value of text that is exactly a decimal number: optional '-', digits, optional
// fraction. from_chars alone would also take "inf", "1e3" and hex.
std::optional<double> decimal_value(std::string_view text) {
  size_t pos = text.starts_with('-') ? 1 : 0;
  const size_t integer_start = pos;
  while (pos < text.size() && is_digit(text[pos])) ++pos;
  const bool has_integer = pos > integer_start;
  if (pos < text.size() && text[pos] == '.') {
    const size_t fraction_start = ++pos;
    while (pos < text.size() && is_digit(text[pos])) ++pos;
    if (pos == fraction_start) return std::nullopt;
  } else if (!has_integer) {
    return std::nullopt;
  }
  if (pos != text.size()) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string_view trim_ascii(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n\f\v");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r\n\f\v") - first + 1);
}

std::optional<std::string> last_number(std::string_view text) {
  std::optional<std::string> found;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!is_digit(text[pos])) {
      ++pos;
      continue;
    }
    const size_t start = pos;
    std::string number;
    if (is_sign(text, start)) number = "-";
    while (pos < text.size() && is_digit(text[pos])) number += text[pos++];
    // Thousands separators: a comma followed by exactly three digits continues the number.
    while (pos + 3 < text.size() && text[pos] == ',' && is_digit(text[pos + 1]) && is_digit(text[pos + 2]) &&
           is_digit(text[pos + 3]) && (pos + 4 >= text.size() || !is_digit(text[pos + 4]))) {
      number.append(text.substr(pos + 1, 3));
      pos += 4;
    }
    if (pos + 1 < text.size() && text[pos] == '.' && is_digit(text[pos + 1])) {
      number += text[pos++];
      while (pos < text.size() && is_digit(text[pos])) number += text[pos++];
    }
    found = std::move(number);
  }
  return found;
}

bool same_number(std::string_view a, std::string_view b) {
  const std::optional<double> x = decimal_value(a), y = decimal_value(b);
  return x && y && *x == *y;
}

std::optional<std::string_view> last_boxed(std::string_view text) {
  constexpr std::string_view kOpen = "\\boxed{";
  const size_t start = text.rfind(kOpen);
  if (start == std::string_view::npos) return std::nullopt;
  const size_t content = start + kOpen.size();
  int depth = 1;
  for (size_t pos = content; pos < text.size(); ++pos) {
    if (text[pos] == '{') ++depth;
    if (text[pos] == '}' && --depth == 0) return text.substr(content, pos - content);
  }
  return std::nullopt;
}

std::optional<std::string_view> last_tagged(std::string_view text, std::string_view open, std::string_view close) {
  const size_t end = text.rfind(close);
  if (end == std::string_view::npos) return std::nullopt;
  const size_t start = text.substr(0, end).rfind(open);
  if (start == std::string_view::npos) return std::nullopt;
  return text.substr(start + open.size(), end - start - open.size());
}

}  // namespace tandem
