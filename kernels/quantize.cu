#include "quantize.cuh"

#include "e4m3.cuh"
#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill a large GPU twice over; each walks the tensor in strides.
constexpr int kBlocks = 264;

// The largest magnitude of x [n] into *amax_bits (a non-negative float's bits order as
// the float does, so atomicMax on them takes the maximum; *amax_bits starts at 0).
template <class T, int N>
__global__ void __launch_bounds__(kThreads) largest_magnitude_kernel(unsigned* amax_bits, const T* x, int64_t n) {
  __shared__ float warp_max[kThreads / 32];
  float amax = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * N;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * N; i < n; i += stride) {
    if (i + N <= n) {
      float v[N];
      load<N>(x + i, v);
#pragma unroll
      for (int k = 0; k < N; ++k) amax = fmaxf(amax, fabsf(v[k]));
    } else {
      for (int64_t j = i; j < n; ++j) amax = fmaxf(amax, fabsf(to_float(x[j])));
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  atomicMax(amax_bits, __float_as_uint(amax));
}

template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    codes_kernel(uint8_t* codes, float* scale, const unsigned* amax_bits, const T* x, int64_t n) {
  const float amax = __uint_as_float(*amax_bits);
  const float inverse = e4m3_inverse_scale(amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = e4m3_scale(amax);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * N;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * N; i < n; i += stride) {
    if (i + N <= n) {
      float v[N];
      load<N>(x + i, v);
      store_e4m3<N>(codes + i, v, inverse);
    } else {
      for (int64_t j = i; j < n; ++j) codes[j] = to_e4m3(to_float(x[j]) * inverse);
    }
  }
}

}  // namespace

void quantize_fp8(const Tensor& codes, const Tensor& scale, const Tensor& x, cudaStream_t stream) {
  constexpr const char* op = "cuda::quantize_fp8";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  check_op_arg(codes, op, "codes", Device::CUDA, {DType::F8_E4M3}, {x.shape[0], x.shape[1]});
  check_op_arg(scale, op, "scale", Device::CUDA, {DType::F32}, {1});
  const int64_t n = x.numel();
  const StreamScratch amax(sizeof(unsigned), stream, op);
  check_cuda(cudaMemsetAsync(amax.at<unsigned>(0), 0, sizeof(unsigned), stream), op, "cudaMemsetAsync");
  dispatch_data(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto pack) {
      constexpr int N = decltype(pack)::value;
      largest_magnitude_kernel<T, N><<<kBlocks, kThreads, 0, stream>>>(amax.at<unsigned>(0), x.ptr<T>(), n);
      check_launch(op);
      codes_kernel<T, N><<<kBlocks, kThreads, 0, stream>>>(codes.ptr<uint8_t>(), scale.ptr<float>(),
                                                            amax.at<unsigned>(0), x.ptr<T>(), n);
      check_launch(op);
    };
    if (aligned16(codes.data, x.data))
      launch(std::integral_constant<int, kPack<T>>{});
    else
      launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace tandem::cuda
