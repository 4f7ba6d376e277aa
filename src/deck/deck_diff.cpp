#include "deck/deck_diff.h"

#include <map>
#include <utility>

#include "deck/trim.h"

namespace tandem {

namespace {

// "section.key" -> value, in text order, from "[section]" and "key = value  # source" lines.
std::vector<std::pair<std::string, std::string>> values_of(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> values;
  std::string section;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    // resolved_text ends each line with " # <where the value came from>".
    const size_t comment = line.rfind(" # ");
    if (comment != std::string::npos) line.resize(comment);
    line = trim_whitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    values.emplace_back(section + "." + trim_whitespace(line.substr(0, equals)), trim_whitespace(line.substr(equals + 1)));
  }
  return values;
}

}  // namespace

std::vector<std::string> changed_deck_keys(const std::string& before, const std::string& after) {
  std::map<std::string, std::string> old_values;
  for (auto& [key, value] : values_of(before)) old_values[key] = value;
  std::vector<std::string> changes;
  for (const auto& [key, value] : values_of(after)) {
    const auto found = old_values.find(key);
    const std::string old_value = found == old_values.end() ? "(absent)" : found->second;
    if (old_value != value) changes.push_back(key + ": " + old_value + " -> " + value);
    if (found != old_values.end()) old_values.erase(found);
  }
  for (const auto& [key, value] : old_values) changes.push_back(key + ": " + value + " -> (absent)");
  return changes;
}

}  // namespace tandem
