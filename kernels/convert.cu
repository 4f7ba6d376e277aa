#include <cuda_bf16.h>

#include "convert.cuh"

namespace tandem {

namespace {
// Four elements per thread: 16-byte loads, 8-byte stores.
__global__ void f32_to_bf16_kernel(__nv_bfloat16* dst, const float* src, size_t count) {
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= count && (reinterpret_cast<uintptr_t>(src + i) & 15) == 0) {
    const float4 v = *reinterpret_cast<const float4*>(src + i);
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    reinterpret_cast<__nv_bfloat162*>(dst + i)[0] = lo;
    reinterpret_cast<__nv_bfloat162*>(dst + i)[1] = hi;
    return;
  }
  for (size_t j = i; j < i + 4 && j < count; ++j) dst[j] = __float2bfloat16_rn(src[j]);
}
}  // namespace

void convert_f32_to_bf16_cuda(uint16_t* dst, const float* src, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned threads = 256;
  const size_t blocks = (count + threads * 4 - 1) / (threads * 4);
  f32_to_bf16_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dst), src,
                                                                           count);
}

}  // namespace tandem
