#include "rollout/stop_strings.h"

#include <algorithm>
#include <stdexcept>

namespace tandem {

namespace {

// A model's vocabulary can be padded past its tokenizer's (Qwen3: 151,936 rows for
// 151,669 tokens); a sampled padding id has no text rather than failing the step.
std::string decode_known(const Tokenizer& tokenizer, std::span<const int32_t> ids) {
  try {
    return tokenizer.decode(ids);
  } catch (const std::out_of_range&) {
  }
  std::string text;
  for (const int32_t& id : ids) {
    try {
      text += tokenizer.decode(std::span<const int32_t>(&id, 1));
    } catch (const std::out_of_range&) {
    }
  }
  return text;
}

}  // namespace

std::optional<std::string> find_stop_string(const Tokenizer& tokenizer, std::span<const int32_t> completion,
                                            const std::vector<std::string>& stops) {
  if (stops.empty() || completion.empty()) return std::nullopt;
  size_t longest = 0;
  for (const std::string& stop : stops) longest = std::max(longest, stop.size());
  // Up to 3 continuation bytes of a character cut at the window's start decode as junk.
  const size_t window = std::min(completion.size(), longest + 3);
  const std::string text = decode_known(tokenizer, completion.last(window));
  for (const std::string& stop : stops)
    if (text.find(stop) != std::string::npos) return stop;
  return std::nullopt;
}

}  // namespace tandem
