#include "rollout/block_allocator.h"

#include <stdexcept>
#include <string>

namespace tandem {

BlockAllocator::BlockAllocator(int32_t blocks) {
  if (blocks < 1)
    throw std::invalid_argument("BlockAllocator: needs at least one block, got " + std::to_string(blocks));
  in_use_.assign(blocks, false);
  free_.reserve(blocks);
  // Pushed in reverse so the first blocks handed out are 0, 1, 2, ...
  for (int32_t b = blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
  if (free_.empty())
    throw std::runtime_error("BlockAllocator: all " + std::to_string(total()) + " KV cache blocks are in use");
  const int32_t block = free_.back();
  free_.pop_back();
  in_use_[block] = true;
  return block;
}

void BlockAllocator::release(int32_t block) {
  if (block < 0 || block >= total() || !in_use_[block])
    throw std::invalid_argument("BlockAllocator: block " + std::to_string(block) + " is not in use (of " +
                                std::to_string(total()) + ")");
  in_use_[block] = false;
  free_.push_back(block);
}

}  // namespace tandem
