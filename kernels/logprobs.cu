#include <cuda_bf16.h>

#include <cfloat>
#include <stdexcept>
#include <string>

#include "logprobs.cuh"
#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 1024;

// The running state of a row's reduction over some of its z = logits/temperature:
// the max m, s = sum exp(z - m) and w = sum exp(z - m) (z - m). Then lse = m + log s and
// the entropy is log s - w / s; keeping w relative to the max avoids the cancellation of
// lse - E[z] when the logits are large.
struct RowState {
  float m = -FLT_MAX, s = 0.f, w = 0.f;
};

// Adds the N values z: one move of the reference to their max (when it is larger), then
// one exponential each.
template <int N>
__device__ inline void add(RowState& r, const float (&z)[N]) {
  float top = z[0];
#pragma unroll
  for (int e = 1; e < N; ++e) top = fmaxf(top, z[e]);
  if (top > r.m) {
    // Moving the reference to top: sum e^(z_i - top) (z_i - top) = e^(m - top) (w + (m - top) s).
    const float scale = __expf(r.m - top);
    r.w = r.s == 0.f ? 0.f : scale * (r.w + (r.m - top) * r.s);
    r.s *= scale;
    r.m = top;
  }
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float d = z[e] - r.m, x = __expf(d);
    r.s += x;
    r.w += x * d;
  }
}

__device__ inline void merge(RowState& r, const RowState& o) {
  if (o.s == 0.f) return;
  if (r.s == 0.f) {
    r = o;
    return;
  }
  const float m = fmaxf(r.m, o.m);
  const float a = __expf(r.m - m), b = __expf(o.m - m);
  r.w = a * (r.w + (r.m - m) * r.s) + b * (o.w + (o.m - m) * o.s);
  r.s = a * r.s + b * o.s;
  r.m = m;
}

__device__ inline RowState shuffle(const RowState& r, int offset) {
  return RowState{__shfl_xor_sync(0xffffffffu, r.m, offset), __shfl_xor_sync(0xffffffffu, r.s, offset),
                  __shfl_xor_sync(0xffffffffu, r.w, offset)};
}

// Every thread ends with the state of the whole row.
__device__ inline void block_reduce(RowState& r) {
  for (int offset = 16; offset > 0; offset >>= 1) merge(r, shuffle(r, offset));
  __shared__ float shared_m[32], shared_s[32], shared_w[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared_m[warp] = r.m, shared_s[warp] = r.s, shared_w[warp] = r.w;
  __syncthreads();
  if (warp == 0) {
    r = lane < blockDim.x / 32 ? RowState{shared_m[lane], shared_s[lane], shared_w[lane]} : RowState{};
    for (int offset = 16; offset > 0; offset >>= 1) merge(r, shuffle(r, offset));
    if (lane == 0) shared_m[0] = r.m, shared_s[0] = r.s, shared_w[0] = r.w;
  }
  __syncthreads();
  r = RowState{shared_m[0], shared_s[0], shared_w[0]};
}

// A row of V elements in three parts: the elements before the first 16-byte boundary, whole
// packs of 16 bytes, the elements after the last. Row starts are 16-byte aligned only when
// V·sizeof(T) is a multiple of 16 (Qwen3's 151,936 is), hence the parts per row.
template <class T>
struct RowParts {
  int64_t head, packs;  // elements before the packs; number of packs
  __device__ RowParts(const T* x, int64_t V) {
    const auto misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16 / sizeof(T));
    head = misaligned == 0 ? 0 : (kPack<T> - misaligned < V ? kPack<T> - misaligned : V);
    packs = (V - head) / kPack<T>;
  }
  // The elements outside the packs, indexed from 0 to outside(V).
  __device__ int64_t outside(int64_t V) const { return V - packs * kPack<T>; }
  __device__ int64_t outside_index(int64_t i) const { return i < head ? i : head + packs * kPack<T> + (i - head); }
};

// Two packs in flight per thread: one block per row has too few threads to keep enough
// loads in flight with one.
constexpr int kPacksInFlight = 2;

template <class T>
__global__ void forward_kernel(float* logp, float* entropy, float* lse, const T* logits, const int32_t* targets,
                               int64_t V, float inv_temperature) {
  constexpr int N = kPack<T>;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  const RowParts<T> parts(x, V);
  const T* packed = x + parts.head;
  RowState r;
  int64_t p = threadIdx.x;
  for (; p + (kPacksInFlight - 1) * blockDim.x < parts.packs; p += kPacksInFlight * blockDim.x) {
    float z[kPacksInFlight][N];
#pragma unroll
    for (int j = 0; j < kPacksInFlight; ++j) load<N>(packed + (p + j * blockDim.x) * N, z[j]);
#pragma unroll
    for (int j = 0; j < kPacksInFlight; ++j) {
#pragma unroll
      for (int e = 0; e < N; ++e) z[j][e] *= inv_temperature;
      add(r, z[j]);
    }
  }
  for (; p < parts.packs; p += blockDim.x) {
    float z[N];
    load<N>(packed + p * N, z);
#pragma unroll
    for (int e = 0; e < N; ++e) z[e] *= inv_temperature;
    add(r, z);
  }
  for (int64_t i = threadIdx.x; i < parts.outside(V); i += blockDim.x) {
    const float z[1] = {to_float(x[parts.outside_index(i)]) * inv_temperature};
    add(r, z);
  }
  block_reduce(r);
  if (threadIdx.x == 0) {
    const float log_s = logf(r.s);
    const float row_lse = r.m + log_s;
    lse[row] = row_lse;
    const int32_t target = targets[row];
    logp[row] = target >= 0 ? to_float(x[target]) * inv_temperature - row_lse : 0.f;
    if (entropy) entropy[row] = target >= 0 ? log_s - r.w / r.s : 0.f;
  }
}

// d/dz of g_logp·log p[target] + g_entropy·H at element v of a row.
struct RowGradient {
  float g_logp, g_entropy, h, lse, inv_temperature;
  int32_t target;
  __device__ float operator()(float x, int64_t v) const {
    const float log_p = x * inv_temperature - lse, p = __expf(log_p);
    const float dz = g_logp * ((v == target ? 1.f : 0.f) - p) - g_entropy * p * (log_p + h);
    return dz * inv_temperature;
  }
};

template <class T>
__global__ void backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* lse,
                                const float* entropy, const float* dlogp, const float* dentropy, int64_t V,
                                float inv_temperature) {
  constexpr int N = kPack<T>;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  T* dx = dlogits + row * V;
  const int32_t target = targets[row];
  const float g_logp = target >= 0 ? dlogp[row] : 0.f;
  const float g_entropy = target >= 0 && dentropy ? dentropy[row] : 0.f;
  const RowGradient gradient{g_logp, g_entropy, g_entropy != 0.f ? entropy[row] : 0.f, lse[row], inv_temperature,
                             target};
  // dlogits has the same misalignment as logits (the same row length, 16-byte aligned
  // bases), so the packs of one are the packs of the other. Each element is read before
  // it is written by the same thread: in-place is safe.
  const RowParts<T> parts(x, V);
  for (int64_t p = threadIdx.x; p < parts.packs; p += blockDim.x) {
    const int64_t first = parts.head + p * N;
    float z[N];
    load<N>(x + first, z);
#pragma unroll
    for (int e = 0; e < N; ++e) z[e] = gradient(z[e], first + e);
    store<N>(dx + first, z);
  }
  for (int64_t i = threadIdx.x; i < parts.outside(V); i += blockDim.x) {
    const int64_t v = parts.outside_index(i);
    dx[v] = from_float<T>(gradient(to_float(x[v]), v));
  }
}

void check_arguments(const Tensor& logits, const Tensor& targets, const Tensor& lse, const char* op) {
  check_op_arg(logits, op, "logits", Device::CUDA, {DType::BF16, DType::F32}, {kAnyExtent, kAnyExtent});
  check_op_arg(targets, op, "targets", Device::CUDA, {DType::I32}, {logits.shape[0]});
  check_op_arg(lse, op, "lse", Device::CUDA, {DType::F32}, {logits.shape[0]});
}

}  // namespace

void token_logprobs_forward(const Tensor& logp, const Tensor& entropy, const Tensor& lse, const Tensor& logits,
                            const Tensor& targets, float temperature, cudaStream_t stream) {
  const char* op = "cuda::token_logprobs_forward";
  check_arguments(logits, targets, lse, op);
  check_op_arg(logp, op, "logp", Device::CUDA, {DType::F32}, {logits.shape[0]});
  if (entropy.data) check_op_arg(entropy, op, "entropy", Device::CUDA, {DType::F32}, {logits.shape[0]});
  const int64_t T = logits.shape[0], V = logits.shape[1];
  if (T == 0) return;
  const float inv = 1.f / temperature;
  auto* out_entropy = entropy.data ? entropy.ptr<float>() : nullptr;
  if (logits.dtype == DType::BF16)
    forward_kernel<<<T, kThreads, 0, stream>>>(logp.ptr<float>(), out_entropy, lse.ptr<float>(),
                                                logits.ptr<__nv_bfloat16>(), targets.ptr<int32_t>(), V, inv);
  else
    forward_kernel<<<T, kThreads, 0, stream>>>(logp.ptr<float>(), out_entropy, lse.ptr<float>(), logits.ptr<float>(),
                                                targets.ptr<int32_t>(), V, inv);
}

void token_logprobs_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& entropy, const Tensor& dlogp, const Tensor& dentropy, float temperature,
                             cudaStream_t stream) {
  const char* op = "cuda::token_logprobs_backward";
  check_arguments(logits, targets, lse, op);
  check_op_arg(dlogits, op, "dlogits", Device::CUDA, {logits.dtype}, {logits.shape[0], logits.shape[1]});
  check_op_arg(dlogp, op, "dlogp", Device::CUDA, {DType::F32}, {logits.shape[0]});
  if (!dentropy.data != !entropy.data)
    throw std::invalid_argument(std::string(op) + ": dentropy and entropy must be given together (an entropy term) "
                                "or both be empty, got dentropy " + dentropy.describe() + ", entropy " +
                                entropy.describe());
  if (dentropy.data) {
    check_op_arg(dentropy, op, "dentropy", Device::CUDA, {DType::F32}, {logits.shape[0]});
    check_op_arg(entropy, op, "entropy", Device::CUDA, {DType::F32}, {logits.shape[0]});
  }
  const int64_t T = logits.shape[0], V = logits.shape[1];
  if (T == 0) return;
  const float inv = 1.f / temperature;
  auto* h = entropy.data ? entropy.ptr<float>() : nullptr;
  auto* dh = dentropy.data ? dentropy.ptr<float>() : nullptr;
  if (logits.dtype == DType::BF16)
    backward_kernel<<<T, kThreads, 0, stream>>>(dlogits.ptr<__nv_bfloat16>(), logits.ptr<__nv_bfloat16>(),
                                                 targets.ptr<int32_t>(), lse.ptr<float>(), h, dlogp.ptr<float>(), dh,
                                                 V, inv);
  else
    backward_kernel<<<T, kThreads, 0, stream>>>(dlogits.ptr<float>(), logits.ptr<float>(), targets.ptr<int32_t>(),
                                                 lse.ptr<float>(), h, dlogp.ptr<float>(), dh, V, inv);
}

}  // namespace tandem::cuda
