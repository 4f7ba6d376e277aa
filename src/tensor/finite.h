// Where a host tensor holds a NaN or an infinity: the checks on weights read from files
// (checkpoints, safetensors) that name the tensor and the element before anything runs on
// them. Works on the bits, so it reads every floating dtype without converting.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "tensor/tensor.h"

namespace tandem {

// The flat index of the first NaN or infinity of a contiguous CPU tensor; none for a
// finite tensor and for integer, bool and FP8 ones (E4M3 has no infinity to tell apart).
std::optional<int64_t> first_non_finite(const Tensor& tensor);

// "" for a finite tensor, else "element <i> of <shape> is <value>" for messages.
std::string describe_non_finite(const Tensor& tensor);

}  // namespace tandem
