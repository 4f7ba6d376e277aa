// What the memory-bound kernels (embedding, rmsnorm, rope, swiglu, elementwise) share:
// packs of elements moved in one 16-byte access, FP32 conversions, group sums, the data
// dtype dispatch and launch checks. Data tensors are F32 or BF16; all math is FP32.
// Included by kernels/*.cu only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/tensor.h"

namespace tandem::cuda {

// Elements of T in one 16-byte access.
template <class T>
inline constexpr int kPack = 16 / sizeof(T);

// N elements moved together; aligned so that a pack of 16 bytes or more is one (or two)
// vector accesses.
template <class T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Pack {
  T v[N];
};

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// N elements at p (aligned to the pack) into FP32 registers, and back.
template <int N, class T>
__device__ inline void load(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = to_float(pack.v[k]);
}

// A 16-byte pack goes out as one vector store, written out: stored as the struct, the
// compiler split it into 2- and 4-byte stores in qk_norm_rope_kernel, each a partial L2
// sector (ncu: 4.6 of 32 bytes a sector used, the L2 at 84%). Generic addressing: the
// rmsnorm backward stores packs into shared memory too.
template <int N, class T>
__device__ inline void store(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int k = 0; k < N; ++k) pack.v[k] = from_float<T>(in[k]);
  if constexpr (sizeof(pack) == 16) {
    unsigned words[4];
    memcpy(words, &pack, sizeof words);
    asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(words[0]), "r"(words[1]), "r"(words[2]),
                 "r"(words[3])
                 : "memory");
  } else {
    *reinterpret_cast<Pack<T, N>*>(p) = pack;
  }
}

// The lanes of a warp that form this thread's group of G consecutive lanes (G divides 32).
template <int G>
__device__ inline unsigned group_mask() {
  if constexpr (G == 32) return 0xffffffffu;
  else return ((1u << G) - 1) << (threadIdx.x % 32 / G * G);
}

// Sum over a group of G lanes; every lane gets the same result, in the same order on
// every run (a butterfly, not atomics).
template <int G>
__device__ inline float group_sum(float v, unsigned mask) {
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset);
  return v;
}

// One thread per pack of N elements of a flat range of n, the last thread taking the
// tail one element at a time. Body::apply<M>(i) handles elements [i, i + M).
template <int N, class Body>
__global__ void flat_kernel(int64_t n, Body body) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * N;
  if (i + N <= n) {
    body.template apply<N>(i);
  } else {
    for (int64_t j = i; j < n; ++j) body.template apply<1>(j);
  }
}

// RoPE's angles of a token, (cos, sin) for each of the `half` dims of a head's half, as the
// rotating kernels keep them in shared memory: dim-transposed for packs of N dims,
// [element of the pack][pack], so that the lanes of a team, which hold neighbouring packs,
// read neighbouring words. Side by side (a lane's N angles of 8 bytes in a row), lanes 0,
// 2, 4, 6 of a team hit the same banks. Element e of pack p is at e * packs + p.
template <int N>
__device__ inline int transposed_angle_slot(int dim, int packs) {
  return (dim % N) * packs + dim / N;
}

// Calls f(integral_constant<int, S>) with the team size for rows that need `lanes` lanes:
// the smallest power of two from S up to Max that covers them (Max if none does).
template <int S, int Max, class F>
void with_team_size(int64_t lanes, F&& f) {
  if constexpr (S < Max) {
    if (lanes > S) return with_team_size<2 * S, Max>(lanes, f);
  }
  f(std::integral_constant<int, S>{});
}

inline void check_cuda(cudaError_t status, const char* op, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(op) + ": " + what + " failed: " + cudaGetErrorString(status));
}

inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
template <class... Ptrs>
bool aligned16(const void* p, Ptrs... rest) {
  return aligned16(p) && aligned16(rest...);
}

// Runs a flat kernel over n elements: 16-byte packs when every pointer the body touches
// is 16-byte aligned, one element per thread otherwise.
template <class T, class Body>
void launch_flat(int64_t n, bool aligned, const Body& body, cudaStream_t stream, const char* op) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  auto launch = [&](auto kernel, int per_thread) {
    const int64_t blocks = (n + int64_t{kThreads} * per_thread - 1) / (int64_t{kThreads} * per_thread);
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, body);
  };
  if (aligned)
    launch(flat_kernel<kPack<T>, Body>, kPack<T>);
  else
    launch(flat_kernel<1, Body>, 1);
  check_launch(op);
}

// Calls f(T{}) with T the element type of a data tensor (float or __nv_bfloat16); the
// caller has already refused every other dtype.
template <class F>
void dispatch_data(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(__nv_bfloat16{});
  else
    f(float{});
}

// The pool StreamScratch draws from, one per device: CUDA's stream-ordered allocator, set to
// keep the memory it gets back. The device's default pool returns freed memory to the driver
// at every synchronisation, so a call after each sync would map fresh memory (tens of
// microseconds of host time, during which the GPU waits for the kernels behind it).
inline cudaMemPool_t scratch_pool(const char* op) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), op, "cudaGetDevice");
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  const std::lock_guard lock(mutex);
  if (const auto found = pools.find(device); found != pools.end()) return found->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaMemPoolCreate(&pool, &props), op, "cudaMemPoolCreate for scratch memory");
  uint64_t keep_everything = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything), op,
             "setting the scratch pool's release threshold");
  pools.emplace(device, pool);
  return pool;
}

// Device scratch memory ordered on `stream`, from scratch_pool (which keeps freed blocks
// for reuse, so a call per step costs no cudaMalloc).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream, const char* op) : stream_(stream) {
    check_cuda(cudaMallocFromPoolAsync(&ptr_, bytes, scratch_pool(op), stream), op,
               "cudaMallocFromPoolAsync of scratch memory");
  }
  ~StreamScratch() { cudaFreeAsync(ptr_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <class U>
  U* at(size_t byte_offset) const {
    return reinterpret_cast<U*>(static_cast<char*>(ptr_) + byte_offset);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace tandem::cuda
