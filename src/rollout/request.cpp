#include "rollout/request.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem {

void SamplingParams::validate() const {
  auto fail = [](const std::string& why) { throw std::invalid_argument("sampling parameters: " + why); };
  if (!std::isfinite(temperature) || temperature < 0)
    fail("temperature must be finite and >= 0 (0 = greedy), got " + std::to_string(temperature));
  if (top_k < 0) fail("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1)) fail("top_p must be in (0, 1] (1 = off), got " + std::to_string(top_p));
  if (max_new_tokens < 1) fail("max_new_tokens must be >= 1, got " + std::to_string(max_new_tokens));
  for (const std::string& stop : stop_strings)
    if (stop.empty()) fail("a stop string is empty");
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
  }
  return "?";
}

}  // namespace tandem
