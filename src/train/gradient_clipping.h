// Clipping by the global L2 norm of all gradients, as torch.nn.utils.clip_grad_norm_:
// scale by max_norm / (norm + 1e-6) when the norm exceeds max_norm. Gradients are FP32
// slabs (one per parameter buffer); sums are accumulated in double.
#pragma once
#include <span>

namespace tandem {

// The sum of squares of every gradient element. Where gradients are sharded over ranks,
// each rank sums its shard and the caller all-reduces the sums before clip_scale.
double gradient_square_sum(std::span<const std::span<float>> slabs);

// The factor to multiply gradients by for a total norm: 1 when norm <= max_norm. A
// non-finite norm gives 1: scaling cannot repair it, and the caller should skip the step.
double clip_scale(double norm, double max_norm);

void scale_gradients(std::span<const std::span<float>> slabs, double factor);

// All three on gradients that every rank holds in full; returns the norm before clipping.
double clip_gradient_norm(std::span<const std::span<float>> slabs, double max_norm);

}  // namespace tandem
