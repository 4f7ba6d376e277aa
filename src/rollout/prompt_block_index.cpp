#include "rollout/prompt_block_index.h"

namespace tandem {

std::vector<int32_t> PromptBlockIndex::name(int32_t previous, std::span<const int32_t> tokens) {
  std::vector<int32_t> key;
  key.reserve(tokens.size() + 1);
  key.push_back(previous);
  key.insert(key.end(), tokens.begin(), tokens.end());
  return key;
}

int32_t PromptBlockIndex::find(int32_t previous, std::span<const int32_t> tokens) const {
  const auto found = blocks_.find(name(previous, tokens));
  return found == blocks_.end() ? kNone : found->second;
}

void PromptBlockIndex::add(int32_t previous, std::span<const int32_t> tokens, int32_t block) {
  std::vector<int32_t> key = name(previous, tokens);
  if (!names_.at(block).empty() || blocks_.count(key)) return;
  blocks_.emplace(key, block);
  names_[block] = std::move(key);
}

void PromptBlockIndex::forget(int32_t block) {
  std::vector<int32_t>& key = names_.at(block);
  if (key.empty()) return;
  blocks_.erase(key);
  key.clear();
}

}  // namespace tandem
