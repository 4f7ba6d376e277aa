#include "swiglu.cuh"

#include <utility>

#include "e4m3.cuh"
#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

// Written as CpuOps writes it, so F32 results differ only by expf's last bits.
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float swiglu(float gate, float up) { return gate * sigmoid(gate) * up; }

template <class T>
struct SwigluForward {
  T* out;
  const T* gate;
  const T* up;
  template <int M>
  __device__ void apply(int64_t i) const {
    float g[M], u[M], y[M];
    load<M>(gate + i, g);
    load<M>(up + i, u);
#pragma unroll
    for (int k = 0; k < M; ++k) y[k] = swiglu(g[k], u[k]);
    store<M>(out + i, y);
  }
};

// Over the elements of out [N, I]; row n of gate_up holds gate's row then up's, times
// scales[n] where there are scales. A pack never crosses a row: packs are used only when
// I is a whole number of them.
template <class T>
struct SwigluStackedForward {
  T* out;
  const T* gate_up;
  const float* scales;
  int64_t width;  // I
  template <int M>
  __device__ void apply(int64_t i) const {
    const int64_t row = i / width;
    const T* gate = gate_up + i + row * width;  // row * 2I + (i - row * I)
    const float scale = scales ? scales[row] : 1.f;  // exact without scales
    float g[M], u[M], y[M];
    load<M>(gate, g);
    load<M>(gate + width, u);
#pragma unroll
    for (int k = 0; k < M; ++k) y[k] = swiglu(g[k] * scale, u[k] * scale);
    store<M>(out + i, y);
  }
};

// The same into FP8 codes with a scale per row: a block per row, whose threads hold the
// row's results in registers until the block knows its largest magnitude.
constexpr int kRowThreads = 256, kRowPacks = 8;  // rows of up to 2048 packs

template <class T, int N>
__global__ void __launch_bounds__(kRowThreads)
    swiglu_codes_kernel(uint8_t* codes, float* code_scales, const T* gate_up, const float* scales, int64_t width) {
  __shared__ float warp_max[kRowThreads / 32];
  const int64_t row = blockIdx.x;
  const int packs = static_cast<int>(width / N);
  const T* gate = gate_up + row * 2 * width;
  const float scale = scales ? scales[row] : 1.f;
  float y[kRowPacks][N];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < kRowPacks; ++j) {
    const int p = threadIdx.x + j * kRowThreads;
    if (p >= packs) continue;
    float g[N], u[N];
    load<N>(gate + p * N, g);
    load<N>(gate + width + p * N, u);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      y[j][k] = swiglu(g[k] * scale, u[k] * scale);
      amax = fmaxf(amax, fabsf(y[j][k]));
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float inverse = e4m3_inverse_scale(amax);
  if (threadIdx.x == 0) code_scales[row] = e4m3_scale(amax);
#pragma unroll
  for (int j = 0; j < kRowPacks; ++j) {
    const int p = threadIdx.x + j * kRowThreads;
    if (p < packs) store_e4m3<N>(codes + row * width + p * N, y[j], inverse);
  }
}

template <class T>
struct SwigluBackward {
  T* dgate;
  T* dup;
  const T* dout;
  const T* gate;
  const T* up;
  template <int M>
  __device__ void apply(int64_t i) const {
    float g[M], u[M], dy[M], dg[M], du[M];
    load<M>(gate + i, g);
    load<M>(up + i, u);
    load<M>(dout + i, dy);
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const float s = sigmoid(g[k]);
      dg[k] = dy[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
      du[k] = dy[k] * g[k] * s;
    }
    store<M>(dgate + i, dg);
    store<M>(dup + i, du);
  }
};

}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, cudaStream_t stream) {
  constexpr const char* op = "cuda::swiglu_forward";
  check_op_arg(gate, op, "gate", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  check_op_arg(up, op, "up", Device::CUDA, {gate.dtype}, {gate.shape[0], gate.shape[1]});
  check_op_arg(out, op, "out", Device::CUDA, {gate.dtype}, {gate.shape[0], gate.shape[1]});
  dispatch_data(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    const SwigluForward<T> body{out.ptr<T>(), gate.ptr<T>(), up.ptr<T>()};
    launch_flat<T>(gate.numel(), aligned16(out.data, gate.data, up.data), body, stream, op);
  });
}

void swiglu_forward(const ScaledRows& out, const ScaledRows& gate_up, cudaStream_t stream) {
  constexpr const char* op = "cuda::swiglu_forward";
  const Tensor& values = gate_up.values;
  check_op_arg(values, op, "gate_up", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  if (values.shape[1] % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": argument 'gate_up' " + values.describe() +
                                " has an odd number of columns: no gate and up halves");
  const int64_t N = values.shape[0], I = values.shape[1] / 2;
  check_in_rows(gate_up, op, "gate_up", Device::CUDA, {values.dtype}, N, 2 * I);
  check_out_rows(out, op, Device::CUDA, values.dtype, N, I);
  const bool coded = out.values.dtype == DType::F8_E4M3;
  dispatch_data(values.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool packed = aligned16(out.values.data, values.data) && I % kPack<T> == 0;
    if (!coded) {
      const SwigluStackedForward<T> body{out.values.ptr<T>(), values.ptr<T>(), gate_up.scales.ptr<float>(), I};
      launch_flat<T>(out.values.numel(), packed, body, stream, op);
      return;
    }
    const int pack = packed ? kPack<T> : 1;
    if (I > int64_t{kRowThreads} * kRowPacks * pack)
      throw std::invalid_argument(std::string(op) + ": rows of " + std::to_string(I) + " exceed the " +
                                  std::to_string(int64_t{kRowThreads} * kRowPacks * pack) +
                                  " that FP8 codes support here");
    if (N == 0) return;
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(N), kRowThreads, 0, stream>>>(out.values.ptr<uint8_t>(), out.scales.ptr<float>(),
                                                                  values.ptr<T>(), gate_up.scales.ptr<float>(), I);
    };
    if (packed) launch(swiglu_codes_kernel<T, kPack<T>>);
    else launch(swiglu_codes_kernel<T, 1>);
    check_launch(op);
  });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, cudaStream_t stream) {
  constexpr const char* op = "cuda::swiglu_backward";
  check_op_arg(gate, op, "gate", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  for (const auto& [tensor, name] : {std::pair{&up, "up"}, {&dout, "dout"}, {&dgate, "dgate"}, {&dup, "dup"}})
    check_op_arg(*tensor, op, name, Device::CUDA, {gate.dtype}, {gate.shape[0], gate.shape[1]});
  dispatch_data(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    const SwigluBackward<T> body{dgate.ptr<T>(), dup.ptr<T>(), dout.ptr<T>(), gate.ptr<T>(), up.ptr<T>()};
    launch_flat<T>(gate.numel(), aligned16(dgate.data, dup.data, dout.data, gate.data, up.data), body, stream, op);
  });
}

}  // namespace tandem::cuda
