// AdamW step on the GPU; CPU twin adamw_step_cpu (src/train/adamw.h), compared in
// tests/gpu_adamw.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <span>

#include "train/adamw.h"

namespace tandem::cuda {
// Same arithmetic as adamw_step_cpu, in the same order, so results agree to FP32
// rounding of sqrt/division. `working` (BF16 bits) may be null.
void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                const AdamWStepScalars& scalars, uint16_t* working, cudaStream_t stream);
// The same over many runs of one slab (params, grads, both moments and working indexed by
// the same offsets), decayed ones with `decayed`, the others with `undecayed`, in one
// launch per 128 runs: a model's hundreds of tensors, most of them small norm weights,
// where a launch each left the GPU between kernels.
void adamw_step_runs(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                     std::span<const AdamWRun> runs, const AdamWStepScalars& decayed,
                     const AdamWStepScalars& undecayed, uint16_t* working, cudaStream_t stream);
}
