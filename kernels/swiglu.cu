#include "swiglu.cuh"

#include <utility>

#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

// Written as CpuOps writes it, so F32 results differ only by expf's last bits.
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

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
    for (int k = 0; k < M; ++k) y[k] = g[k] * sigmoid(g[k]) * u[k];
    store<M>(out + i, y);
  }
};

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
    load<M>(dgate + i, dg);
    load<M>(dup + i, du);
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const float s = sigmoid(g[k]);
      dg[k] += dy[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
      du[k] += dy[k] * g[k] * s;
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
