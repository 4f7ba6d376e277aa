#include "deck/scan.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "deck/deck_error.h"
#include "deck/suggest.h"
#include "deck/trim.h"

namespace tandem {
namespace {

bool is_name(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

}  // namespace

std::vector<DeckLine> scan_deck_text(const std::string& text, const std::string& file, const std::vector<OptionSpec>& options) {
  std::vector<DeckLine> lines;
  std::istringstream stream(text);
  std::string raw, section;
  for (int number = 1; std::getline(stream, raw); ++number) {
    const std::string content = trim_whitespace(raw.substr(0, raw.find('#')));
    if (content.empty()) continue;
    if (content.front() == '[') {
      const std::string name = content.back() == ']' ? content.substr(1, content.size() - 2) : "";
      if (!is_name(name)) throw DeckError(file, number, "", "malformed section header '" + content + "': expected [name] with letters, digits, '-', '_'");
      if (!is_known_section(name, options)) throw DeckError(file, number, "", unknown_section_reason(name, options));
      section = name;
      continue;
    }
    const size_t equals = content.find('=');
    if (equals == std::string::npos) throw DeckError(file, number, "", "malformed line '" + content + "': expected 'key = value' or '[section]'");
    const std::string name = trim_whitespace(content.substr(0, equals));
    if (name.empty()) throw DeckError(file, number, "", "malformed line '" + content + "': no key before '='");
    if (!is_name(name)) throw DeckError(file, number, "", "malformed line '" + content + "': key '" + name + "' may hold only letters, digits, '-', '_', '.'");
    const std::string key = section.empty() ? name : section + "." + name;
    const auto earlier = std::find_if(lines.begin(), lines.end(), [&](const DeckLine& line) { return line.key == key; });
    if (earlier != lines.end()) throw DeckError(file, number, key, "set twice, on lines " + std::to_string(earlier->line) + " and " + std::to_string(number));
    lines.push_back({key, trim_whitespace(content.substr(equals + 1)), number});
  }
  return lines;
}

}  // namespace tandem
