// Fixed-size KV cache blocks handed out by index from a free list. Sequences hold lists of
// blocks (their block tables), so memory is granted a block at a time as they grow and
// nothing is lost to fragmentation when sequences of different lengths come and go. A
// block may have several holders (sequences sharing a prompt's keys and values:
// rollout/prompt_block_index.h); it is free again when its last holder releases it.
#pragma once
#include <cstdint>
#include <vector>

namespace tandem {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t blocks);

  int32_t total() const { return static_cast<int32_t>(holders_.size()); }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }

  // A free block, with one holder. Throws std::runtime_error when every block is taken:
  // callers check free_count() first.
  int32_t allocate();
  // One more holder of a block in use.
  void share(int32_t block);
  // One holder fewer; returns whether that was the last, and the block is free again.
  // Throws std::invalid_argument for an index out of range or a block that is not in use.
  bool release(int32_t block);

 private:
  void check_in_use(int32_t block, const char* what) const;

  std::vector<int32_t> free_;  // a stack: the block freed last is reused first, still warm in cache
  std::vector<int32_t> holders_;
};

}  // namespace tandem
