#include "swiglu.cuh"

#include <utility>

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

// Over the elements of out [N, I]; row n of gate_up holds gate's row then up's. A pack
// never crosses a row: packs are used only when I is a whole number of them.
template <class T>
struct SwigluStackedForward {
  T* out;
  const T* gate_up;
  int64_t width;  // I
  template <int M>
  __device__ void apply(int64_t i) const {
    const int64_t row = i / width;
    const T* gate = gate_up + i + row * width;  // row * 2I + (i - row * I)
    float g[M], u[M], y[M];
    load<M>(gate, g);
    load<M>(gate + width, u);
#pragma unroll
    for (int k = 0; k < M; ++k) y[k] = swiglu(g[k], u[k]);
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

void swiglu_forward(const Tensor& out, const Tensor& gate_up, cudaStream_t stream) {
  constexpr const char* op = "cuda::swiglu_forward";
  check_op_arg(gate_up, op, "gate_up", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  if (gate_up.shape[1] % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": argument 'gate_up' " + gate_up.describe() +
                                " has an odd number of columns: no gate and up halves");
  const int64_t I = gate_up.shape[1] / 2;
  check_op_arg(out, op, "out", Device::CUDA, {gate_up.dtype}, {gate_up.shape[0], I});
  dispatch_data(gate_up.dtype, [&](auto tag) {
    using T = decltype(tag);
    const SwigluStackedForward<T> body{out.ptr<T>(), gate_up.ptr<T>(), I};
    launch_flat<T>(out.numel(), aligned16(out.data, gate_up.data) && I % kPack<T> == 0, body, stream, op);
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
