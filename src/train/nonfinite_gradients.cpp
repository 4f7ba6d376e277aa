#include "train/nonfinite_gradients.h"

#include <algorithm>
#include <cmath>

namespace tandem {

std::string first_non_finite_gradient(TrainerBackend& backend, const Tensor& grads, const ParameterLayout& layout,
                                      int64_t begin, int64_t end) {
  for (const ParameterInfo& info : layout.tensors()) {
    const int64_t first = std::max(info.offset, begin), last = std::min(info.offset + info.numel(), end);
    if (first >= last) continue;
    const Tensor part = Tensor::view(grads.ptr<float>() + first, DType::F32, grads.device, {last - first});
    if (!std::isfinite(backend.square_sum(part))) return info.name;
  }
  return "";
}

}  // namespace tandem
