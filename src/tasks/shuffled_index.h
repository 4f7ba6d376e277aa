// A seeded permutation of [0, n) evaluated one index at a time, in O(1) memory: a
// four-round Feistel network on the smallest even power of two >= n, walking the cycle
// until the value falls inside [0, n). Datasets are read in a fresh order every epoch
// without storing (or sharing between threads) a shuffled list.
#pragma once
#include <cstdint>
#include <stdexcept>

namespace tandem {

inline uint64_t shuffled_index(uint64_t i, uint64_t n, uint64_t key) {
  if (i >= n) throw std::out_of_range("shuffled_index: index past the end of the range");
  int half_bits = 1;
  while ((uint64_t{1} << (2 * half_bits)) < n) ++half_bits;
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  const auto round_function = [key](uint64_t value, uint64_t round) {
    uint64_t z = value + key + round * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t x = i;
  do {
    uint64_t left = x >> half_bits, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t next = left ^ (round_function(right, round) & mask);
      left = right;
      right = next;
    }
    x = (left << half_bits) | right;
  } while (x >= n);
  return x;
}

}  // namespace tandem
