#include "train/adamw.h"

#include <cmath>

#include "tensor/bf16.h"

namespace tandem {

AdamWStepScalars adamw_scalars(const AdamWSettings& s, int64_t step, bool apply_decay) {
  const double bias1 = 1.0 - std::pow(s.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(s.beta2, static_cast<double>(step));
  return {static_cast<float>(s.lr / bias1),
          static_cast<float>(std::sqrt(bias2)),
          static_cast<float>(s.beta1),
          static_cast<float>(s.beta2),
          static_cast<float>(s.eps),
          static_cast<float>(apply_decay ? 1.0 - s.lr * s.weight_decay : 1.0)};
}

void adamw_step_cpu(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                    const AdamWStepScalars& k, uint16_t* working) {
#pragma omp parallel for schedule(static) if (count >= (1u << 16))
  for (size_t i = 0; i < count; ++i) {
    const float g = grads[i];
    const float m = k.beta1 * exp_avg[i] + (1.0f - k.beta1) * g;
    const float v = k.beta2 * exp_avg_sq[i] + (1.0f - k.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float p = params[i] * k.decay - k.step_size * m / (std::sqrt(v) / k.bias2_sqrt + k.eps);
    params[i] = p;
    if (working) working[i] = float_to_bf16(p);
  }
}

}  // namespace tandem
