// AdamW with decoupled weight decay, on FP32 master weights (PyTorch's torch.optim.AdamW
// update, bias-corrected moments). The state is two FP32 buffers the size of the
// parameters, which the caller allocates under the optimizer tag.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tandem {

struct AdamWSettings {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// One step over `count` parameters; `step` counts from 1. `decay_mask` (may be null)
// says per parameter whether weight decay applies (1) or not (0).
void adamw_step_cpu(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                    int64_t step, const AdamWSettings& settings, const uint8_t* decay_mask = nullptr);

}  // namespace tandem
