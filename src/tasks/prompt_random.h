// The random stream behind one prompt: SplitMix64 started from a mix of (seed, index).
// The draws are defined here, not by <random>'s distributions, whose results differ from one
// standard library to another: a task must give the same prompt on every machine.
#pragma once
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace tandem {

class PromptRandom {
 public:
  PromptRandom(uint64_t seed, uint64_t index) : state_(mix(seed + mix(index))) {}

  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix(state_);
  }

  // Uniform over [low, high], both included; rejection keeps it exactly uniform.
  int64_t uniform(int64_t low, int64_t high) {
    if (high < low) throw std::invalid_argument("PromptRandom::uniform: empty range");
    const uint64_t span = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) + 1;
    if (span == 0) return static_cast<int64_t>(next());  // the whole 64-bit range
    const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % span;
    uint64_t draw = next();
    while (draw >= limit) draw = next();
    return static_cast<int64_t>(static_cast<uint64_t>(low) + draw % span);
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace tandem
