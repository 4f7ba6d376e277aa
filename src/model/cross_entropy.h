// Next-token cross-entropy on FP32 host logits: the simple loss the model tests (and the
// CPU reference) backpropagate. The GPU path's fused, chunked version lives with training.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {

// Targets for next-token prediction in a packed batch: targets[t] = ids[t+1] inside a
// sequence, -1 (ignored) at each sequence's last token.
std::vector<int32_t> next_token_targets(std::span<const int32_t> token_ids, std::span<const int32_t> cu_seqlens);

// Returns Σ_t -log softmax(logits[t])[targets[t]] over tokens whose target is >= 0,
// accumulated in double. When dlogits has data it receives scale * (softmax - onehot)
// (rows of ignored tokens zeroed); it may be the logits tensor itself.
double cross_entropy(const Tensor& logits, std::span<const int32_t> targets, const Tensor& dlogits, float scale = 1);

}  // namespace tandem
