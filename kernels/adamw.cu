#include <cuda_bf16.h>

#include "adamw.cuh"

#include <algorithm>
#include <cstdint>

namespace tandem::cuda {

namespace {
// One element: every operation rounded on its own (no FMA contraction, IEEE sqrt and
// division), in the CPU twin's order: the two agree bit for bit, so a run restarts
// identically on either backend.
__device__ inline float adamw_element(float& param, float g, float& m, float& v, const AdamWStepScalars& k) {
  m = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(__fsub_rn(1.0f, k.beta1), g));
  v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, k.beta2), g), g));
  param = __fsub_rn(__fmul_rn(param, k.decay),
                    __fdiv_rn(__fmul_rn(k.step_size, m), __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.bias2_sqrt), k.eps)));
  return param;
}

__global__ void adamw_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, size_t count, AdamWStepScalars k,
                             __nv_bfloat16* __restrict__ working) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(p, grads[i], m, v, k);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (working) working[i] = __float2bfloat16_rn(p);
  }
}

// The same on 4 consecutive elements per access (16-byte loads and stores of the four
// FP32 streams, 8 bytes of the BF16 one): the step is memory-bound, and wider accesses
// keep more bytes in flight. count4 = count / 4; every pointer 16-byte aligned (working 8).
__global__ void adamw_kernel_x4(float4* __restrict__ params, const float4* __restrict__ grads,
                                float4* __restrict__ exp_avg, float4* __restrict__ exp_avg_sq, size_t count4,
                                AdamWStepScalars k, uint2* __restrict__ working) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count4;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float4 p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    const float4 g = grads[i];
    adamw_element(p.x, g.x, m.x, v.x, k);
    adamw_element(p.y, g.y, m.y, v.y, k);
    adamw_element(p.z, g.z, m.z, v.z, k);
    adamw_element(p.w, g.w, m.w, v.w, k);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (working) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
      working[i] = make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
    }
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
}  // namespace

void adamw_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, size_t count,
                const AdamWStepScalars& scalars, uint16_t* working, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned threads = 256;
  const auto blocks = [&](size_t work) {
    return static_cast<unsigned>(std::min<size_t>((work + threads - 1) / threads, 132 * 16));
  };
  if (count % 4 == 0 && aligned(params, 16) && aligned(grads, 16) && aligned(exp_avg, 16) && aligned(exp_avg_sq, 16) &&
      (!working || aligned(working, 8))) {
    adamw_kernel_x4<<<blocks(count / 4), threads, 0, stream>>>(
        reinterpret_cast<float4*>(params), reinterpret_cast<const float4*>(grads), reinterpret_cast<float4*>(exp_avg),
        reinterpret_cast<float4*>(exp_avg_sq), count / 4, scalars, reinterpret_cast<uint2*>(working));
    return;
  }
  adamw_kernel<<<blocks(count), threads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, count, scalars,
                                                      reinterpret_cast<__nv_bfloat16*>(working));
}

}  // namespace tandem::cuda
