#include "train/nonfinite_gradients.h"

#include <cmath>

namespace tandem {

std::string first_non_finite_gradient(TrainerBackend& backend, const Tensor& grads, const ParameterLayout& layout) {
  for (const ParameterInfo& info : layout.tensors()) {
    const Tensor part = Tensor::view(grads.ptr<float>() + info.offset, DType::F32, grads.device, {info.numel()});
    if (!std::isfinite(backend.square_sum(part))) return info.name;
  }
  return "";
}

}  // namespace tandem
