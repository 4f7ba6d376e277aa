#include "train/gradient_clipping.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace tandem {

double gradient_square_sum(std::span<const std::span<float>> slabs) {
  double sum = 0;
  for (const std::span<float> slab : slabs) {
    const auto n = static_cast<int64_t>(slab.size());
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(slab[i]) * slab[i];
  }
  return sum;
}

double clip_scale(double norm, double max_norm) {
  if (!(max_norm > 0))
    throw std::invalid_argument("gradient clipping: max_norm must be > 0, got " + std::to_string(max_norm));
  if (!std::isfinite(norm) || norm <= max_norm) return 1;
  return max_norm / (norm + 1e-6);
}

void scale_gradients(std::span<const std::span<float>> slabs, double factor) {
  const auto f = static_cast<float>(factor);
  for (const std::span<float> slab : slabs) {
    const auto n = static_cast<int64_t>(slab.size());
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) slab[i] *= f;
  }
}

double clip_gradient_norm(std::span<const std::span<float>> slabs, double max_norm) {
  const double norm = std::sqrt(gradient_square_sum(slabs));
  const double factor = clip_scale(norm, max_norm);
  if (factor != 1) scale_gradients(slabs, factor);
  return norm;
}

}  // namespace tandem
