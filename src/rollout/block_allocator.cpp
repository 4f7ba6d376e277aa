#include "rollout/block_allocator.h"

#include <stdexcept>
#include <string>

namespace tandem {

BlockAllocator::BlockAllocator(int32_t blocks) {
  if (blocks < 1)
    throw std::invalid_argument("BlockAllocator: needs at least one block, got " + std::to_string(blocks));
  holders_.assign(blocks, 0);
  free_.reserve(blocks);
  // Pushed in reverse so the first blocks handed out are 0, 1, 2, ...
  for (int32_t b = blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
  if (free_.empty())
    throw std::runtime_error("BlockAllocator: all " + std::to_string(total()) + " KV cache blocks are in use");
  const int32_t block = free_.back();
  free_.pop_back();
  holders_[block] = 1;
  return block;
}

void BlockAllocator::check_in_use(int32_t block, const char* what) const {
  if (block < 0 || block >= total() || holders_[block] == 0)
    throw std::invalid_argument(std::string("BlockAllocator: cannot ") + what + " block " + std::to_string(block) +
                                ": it is not in use (of " + std::to_string(total()) + ")");
}

void BlockAllocator::share(int32_t block) {
  check_in_use(block, "share");
  ++holders_[block];
}

bool BlockAllocator::release(int32_t block) {
  check_in_use(block, "release");
  if (--holders_[block] > 0) return false;
  free_.push_back(block);
  return true;
}

}  // namespace tandem
