// Fixed-size KV cache blocks handed out by index from a free list. Sequences hold lists of
// blocks (their block tables), so memory is granted a block at a time as they grow and
// nothing is lost to fragmentation when sequences of different lengths come and go.
#pragma once
#include <cstdint>
#include <vector>

namespace tandem {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t blocks);

  int32_t total() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }

  // Throws std::runtime_error when every block is taken: callers check free_count() first.
  int32_t allocate();
  // Throws std::invalid_argument for an index out of range or a block that is not in use.
  void release(int32_t block);

 private:
  std::vector<int32_t> free_;  // a stack: the block freed last is reused first, still warm in cache
  std::vector<bool> in_use_;
};

}  // namespace tandem
