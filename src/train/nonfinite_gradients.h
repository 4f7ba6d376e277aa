// Finding where a NaN or an infinity entered the gradients, on either backend, through the
// squared-norm reduction the clipping runs anyway: a non-finite sum says the slab holds
// one, and only then is each tensor's sum taken, in layout order, to name the first.
// Private to src/train.
#pragma once
#include <cstdint>
#include <string>

#include "model/parameters.h"
#include "train/trainer_backend.h"

namespace tandem {

// The name of the first tensor of `layout` whose part of `grads` (a flat F32 slab) holds a
// non-finite value; "" when every one is finite. Only the slab range [begin, end) is
// looked at (ZeRO-1: a rank's shard).
std::string first_non_finite_gradient(TrainerBackend& backend, const Tensor& grads, const ParameterLayout& layout,
                                      int64_t begin = 0, int64_t end = INT64_MAX);

}  // namespace tandem
