// A line-by-line pass over deck text with the grammar of Boost's config-file parser.
// Boost reports neither line numbers nor malformed lines' positions, so this pass finds the
// line of every key and stops at the first line Boost would refuse or misread.
#pragma once
#include <string>
#include <vector>

#include "deck/option_spec.h"

namespace tandem {

struct DeckLine {
  std::string key;  // "section.name", as Boost names it
  std::string value;
  int line;         // 1-based
};

// Throws DeckError naming `file` and the line for: a malformed line (no '=', empty key, bad
// characters), a malformed or unknown [section] header, and a key set twice.
std::vector<DeckLine> scan_deck_text(const std::string& text, const std::string& file, const std::vector<OptionSpec>& options);

}  // namespace tandem
