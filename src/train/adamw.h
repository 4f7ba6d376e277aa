// AdamW with decoupled weight decay on FP32 master weights (torch.optim.AdamW's update,
// bias-corrected moments). The state is two FP32 buffers the size of the parameters,
// which the caller allocates under the optimizer tag. Weight decay is chosen per tensor
// (2-D matrices only): callers step one tensor, or one run of tensors alike, at a time.
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

// The scalars of step `step` (counting from 1), shared by the CPU and CUDA versions so
// both compute the same update.
struct AdamWStepScalars {
  float step_size;   // lr / (1 - beta1^step)
  float bias2_sqrt;  // sqrt(1 - beta2^step)
  float beta1, beta2, eps;
  float decay;       // 1 - lr * weight_decay, or 1 without decay
};
AdamWStepScalars adamw_scalars(const AdamWSettings& settings, int64_t step, bool apply_decay);

// A stretch of a slab that AdamW steps with one set of scalars: `count` values from
// `offset` of the parameters, gradients and both moments, with or without weight decay.
struct AdamWRun {
  int64_t offset = 0;
  int64_t count = 0;
  bool decayed = false;
};
// One step over `count` parameters in host memory. When `working` is not null, the
// updated parameters are also written there as BF16 bits (the derived working copy).
void adamw_step_cpu(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                    const AdamWStepScalars& scalars, uint16_t* working = nullptr);

}  // namespace tandem
