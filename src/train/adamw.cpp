#include "train/adamw.h"

#include <cmath>

namespace tandem {

void adamw_step_cpu(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                    int64_t step, const AdamWSettings& s, const uint8_t* decay_mask) {
  const double bias1 = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(s.beta2, static_cast<double>(step));
  const float step_size = static_cast<float>(s.lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float decay = static_cast<float>(1.0 - s.lr * s.weight_decay);
  const float eps = static_cast<float>(s.eps);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < count; ++i) {
    const float g = grads[i];
    if (!decay_mask || decay_mask[i]) params[i] *= decay;
    exp_avg[i] = b1 * exp_avg[i] + (1.0f - b1) * g;
    exp_avg_sq[i] = b2 * exp_avg_sq[i] + (1.0f - b2) * g * g;
    const float denom = std::sqrt(exp_avg_sq[i]) / bias2_sqrt + eps;
    params[i] -= step_size * exp_avg[i] / denom;
  }
}

}  // namespace tandem
