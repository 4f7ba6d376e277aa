#include "deck/suggest.h"

#include <algorithm>
#include <numeric>

namespace tandem {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  std::iota(previous.begin(), previous.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(previous, current);
  }
  return previous[b.size()];
}

// The candidate closest to `word`, or "" when even the closest is mostly different: a far-off
// suggestion would send the user the wrong way.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(3, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  return best;
}

std::vector<std::string> sections_of(const std::vector<OptionSpec>& options) {
  std::vector<std::string> sections;
  for (const OptionSpec& spec : options)
    if (std::find(sections.begin(), sections.end(), spec.section()) == sections.end()) sections.push_back(spec.section());
  return sections;
}

}  // namespace

bool is_known_section(const std::string& section, const std::vector<OptionSpec>& options) {
  const std::vector<std::string> sections = sections_of(options);
  return std::find(sections.begin(), sections.end(), section) != sections.end();
}

std::string unknown_section_reason(const std::string& section, const std::vector<OptionSpec>& options) {
  const std::vector<std::string> sections = sections_of(options);
  const std::string suggestion = nearest(section, sections);
  if (!suggestion.empty()) return "unknown section [" + section + "] (did you mean [" + suggestion + "]?)";
  std::string known;
  for (const std::string& name : sections) known += (known.empty() ? "[" : ", [") + name + "]";
  return "unknown section [" + section + "] (sections are " + known + ")";
}

std::string unknown_key_reason(const std::string& key, const std::vector<OptionSpec>& options) {
  const size_t dot = key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  if (!section.empty() && !is_known_section(section, options)) return unknown_section_reason(section, options);
  // The right name in the wrong section (or in none) is the likeliest slip.
  const std::string name = dot == std::string::npos ? key : key.substr(dot + 1);
  for (const OptionSpec& spec : options)
    if (spec.name() == name) return "unknown key (did you mean '" + spec.key + "'?)";
  std::vector<std::string> keys;
  for (const OptionSpec& spec : options) keys.push_back(spec.key);
  const std::string suggestion = nearest(key, keys);
  if (!suggestion.empty()) return "unknown key (did you mean '" + suggestion + "'?)";
  return "unknown key (tandem --help lists every key)";
}

}  // namespace tandem
