// The KV cache blocks that hold a whole block of some running sequence's prompt, found by
// the tokens they hold and the block before them. Sequences whose prompts begin alike (the
// samples of a GRPO group) then hold one copy of those keys and values and prefill them
// once: a block's rows depend only on the tokens up to its end, and a prompt's whole
// blocks are never written again.
//
// A block is named by (the block before it, or kNone; its tokens). Any holder of a block
// found here holds the blocks before it too (it found them first), so a block is never
// freed while one named after it is still indexed: forget() each block as it is freed.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace tandem {

class PromptBlockIndex {
 public:
  static constexpr int32_t kNone = -1;

  explicit PromptBlockIndex(int32_t blocks) : names_(static_cast<size_t>(blocks)) {}

  // The block after `previous` that holds `tokens`, or kNone.
  int32_t find(int32_t previous, std::span<const int32_t> tokens) const;
  // Indexes `block` as holding `tokens` after `previous`, unless another block already is.
  void add(int32_t previous, std::span<const int32_t> tokens, int32_t block);
  // Takes a freed block out, if it was indexed.
  void forget(int32_t block);

 private:
  static std::vector<int32_t> name(int32_t previous, std::span<const int32_t> tokens);

  std::map<std::vector<int32_t>, int32_t> blocks_;  // name -> block
  std::vector<std::vector<int32_t>> names_;         // block -> its name; empty when not indexed
};

}  // namespace tandem
