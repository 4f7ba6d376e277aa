#include "rollout/stop_strings.h"

#include <algorithm>

namespace tandem {

std::optional<std::string> find_stop_string(const Tokenizer& tokenizer, std::span<const int32_t> completion,
                                            const std::vector<std::string>& stops) {
  if (stops.empty() || completion.empty()) return std::nullopt;
  size_t longest = 0;
  for (const std::string& stop : stops) longest = std::max(longest, stop.size());
  // Up to 3 continuation bytes of a character cut at the window's start decode as junk.
  const size_t window = std::min(completion.size(), longest + 3);
  const std::string text = tokenizer.decode(completion.last(window));
  for (const std::string& stop : stops)
    if (text.find(stop) != std::string::npos) return stop;
  return std::nullopt;
}

}  // namespace tandem
