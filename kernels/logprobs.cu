#include <cuda_bf16.h>

#include <cfloat>

#include "logprobs.cuh"
#include "model/op_args.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 1024;

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Online (max, sum of exp) pair merge.
__device__ inline void merge(float& m, float& s, float other_m, float other_s) {
  const float merged = fmaxf(m, other_m);
  s = (m == -FLT_MAX ? 0.f : s * __expf(m - merged)) + (other_m == -FLT_MAX ? 0.f : other_s * __expf(other_m - merged));
  m = merged;
}

__device__ inline void block_reduce(float& m, float& s) {
  for (int offset = 16; offset > 0; offset >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  __shared__ float shared_m[32], shared_s[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared_m[warp] = m, shared_s[warp] = s;
  __syncthreads();
  if (warp == 0) {
    m = lane < blockDim.x / 32 ? shared_m[lane] : -FLT_MAX;
    s = lane < blockDim.x / 32 ? shared_s[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1)
      merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    if (lane == 0) shared_m[0] = m, shared_s[0] = s;
  }
  __syncthreads();
  m = shared_m[0];
  s = shared_s[0];
}

template <class T>
__global__ void forward_kernel(float* logp, float* lse, const T* logits, const int32_t* targets, int64_t V,
                               float inv_temperature) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  float m = -FLT_MAX, s = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float z = to_float(x[v]) * inv_temperature;
    if (z > m) {
      s = s * __expf(m - z) + 1.f;
      m = z;
    } else {
      s += __expf(z - m);
    }
  }
  block_reduce(m, s);
  if (threadIdx.x == 0) {
    const float row_lse = m + logf(s);
    lse[row] = row_lse;
    const int32_t target = targets[row];
    logp[row] = target >= 0 ? to_float(x[target]) * inv_temperature - row_lse : 0.f;
  }
}

template <class T>
__global__ void backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* lse,
                                const float* dlogp, int64_t V, float inv_temperature) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  T* dx = dlogits + row * V;
  const int32_t target = targets[row];
  const float scale = target >= 0 ? dlogp[row] * inv_temperature : 0.f;
  const float row_lse = lse[row];
  // Each element is read before it is written by the same thread: in-place is safe.
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = __expf(to_float(x[v]) * inv_temperature - row_lse);
    dx[v] = from_float<T>(scale * ((v == target ? 1.f : 0.f) - p));
  }
}

void check_arguments(const Tensor& logits, const Tensor& targets, const char* op) {
  check_op_arg(logits, op, "logits", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  check_op_arg(targets, op, "targets", Device::CUDA, {DType::I32}, {logits.shape[0]});
}

}  // namespace

void token_logprobs_forward(const Tensor& logp, const Tensor& lse, const Tensor& logits, const Tensor& targets,
                            float temperature, cudaStream_t stream) {
  const char* op = "cuda::token_logprobs_forward";
  check_arguments(logits, targets, op);
  check_op_arg(logp, op, "logp", Device::CUDA, {DType::F32}, {logits.shape[0]});
  check_op_arg(lse, op, "lse", Device::CUDA, {DType::F32}, {logits.shape[0]});
  const int64_t T = logits.shape[0], V = logits.shape[1];
  if (T == 0) return;
  const float inv = 1.f / temperature;
  if (logits.dtype == DType::BF16)
    forward_kernel<<<T, kThreads, 0, stream>>>(logp.ptr<float>(), lse.ptr<float>(), logits.ptr<__nv_bfloat16>(),
                                                targets.ptr<int32_t>(), V, inv);
  else
    forward_kernel<<<T, kThreads, 0, stream>>>(logp.ptr<float>(), lse.ptr<float>(), logits.ptr<float>(),
                                                targets.ptr<int32_t>(), V, inv);
}

void token_logprobs_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& dlogp, float temperature, cudaStream_t stream) {
  const char* op = "cuda::token_logprobs_backward";
  check_arguments(logits, targets, op);
  check_op_arg(dlogits, op, "dlogits", Device::CUDA, {logits.dtype}, {logits.shape[0], logits.shape[1]});
  check_op_arg(lse, op, "lse", Device::CUDA, {DType::F32}, {logits.shape[0]});
  check_op_arg(dlogp, op, "dlogp", Device::CUDA, {DType::F32}, {logits.shape[0]});
  const int64_t T = logits.shape[0], V = logits.shape[1];
  if (T == 0) return;
  const float inv = 1.f / temperature;
  if (logits.dtype == DType::BF16)
    backward_kernel<<<T, kThreads, 0, stream>>>(dlogits.ptr<__nv_bfloat16>(), logits.ptr<__nv_bfloat16>(),
                                                 targets.ptr<int32_t>(), lse.ptr<float>(), dlogp.ptr<float>(), V, inv);
  else
    backward_kernel<<<T, kThreads, 0, stream>>>(dlogits.ptr<float>(), logits.ptr<float>(), targets.ptr<int32_t>(),
                                                 lse.ptr<float>(), dlogp.ptr<float>(), V, inv);
}

}  // namespace tandem::cuda
