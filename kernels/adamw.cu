#include <cuda_bf16.h>

#include "adamw.cuh"

namespace tandem::cuda {

namespace {
__global__ void adamw_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, size_t count, AdamWStepScalars k,
                             __nv_bfloat16* __restrict__ working) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i];
    // Every operation rounded on its own (no FMA contraction, IEEE sqrt and division), in
    // the CPU twin's order: the two agree bit for bit, so a run restarts identically on
    // either backend.
    const float m = __fadd_rn(__fmul_rn(k.beta1, exp_avg[i]), __fmul_rn(__fsub_rn(1.0f, k.beta1), g));
    const float v = __fadd_rn(__fmul_rn(k.beta2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, k.beta2), g), g));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float p = __fsub_rn(__fmul_rn(params[i], k.decay),
                              __fdiv_rn(__fmul_rn(k.step_size, m), __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps)));
    params[i] = p;
    if (working) working[i] = __float2bfloat16_rn(p);
  }
}
}  // namespace

void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                const AdamWStepScalars& scalars, uint16_t* working, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned threads = 256;
  const size_t blocks = std::min<size_t>((count + threads - 1) / threads, 132 * 16);
  adamw_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      params, grads, exp_avg, exp_avg_sq, count, scalars, reinterpret_cast<__nv_bfloat16*>(working));
}

}  // namespace tandem::cuda
