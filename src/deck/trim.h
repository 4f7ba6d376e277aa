// Whitespace trimming as Boost's config-file parser does it, so every part of the deck reads
// a value the same way Boost does.
#pragma once
#include <string>

namespace tandem {

inline std::string trim_whitespace(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

}  // namespace tandem
