#include "elementwise.cuh"

#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

// No __restrict__: out may be a or b, and each element is read before it is written
// by the same thread.
template <class T>
struct AddBody {
  T* out;
  const T* a;
  const T* b;
  template <int M>
  __device__ void apply(int64_t i) const {
    float x[M], y[M];
    load<M>(a + i, x);
    load<M>(b + i, y);
#pragma unroll
    for (int k = 0; k < M; ++k) x[k] += y[k];
    store<M>(out + i, x);
  }
};

void require_device_tensor(const Tensor& t, const char* op, const char* arg) {
  if (!t.data || t.device != Device::CUDA || !t.is_contiguous())
    throw std::invalid_argument(std::string(op) + ": argument '" + arg +
                                "' must be a non-empty contiguous CUDA tensor, got " + t.describe());
}

}  // namespace

void zero(const Tensor& dst, cudaStream_t stream) {
  require_device_tensor(dst, "cuda::zero", "dst");
  check_cuda(cudaMemsetAsync(dst.data, 0, dst.nbytes(), stream), "cuda::zero", "cudaMemsetAsync");
}

void copy(const Tensor& dst, const Tensor& src, cudaStream_t stream) {
  require_device_tensor(dst, "cuda::copy", "dst");
  require_device_tensor(src, "cuda::copy", "src");
  if (dst.dtype != src.dtype || dst.shape != src.shape)
    throw std::invalid_argument("cuda::copy: cannot copy " + src.describe() + " into " + dst.describe());
  check_cuda(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice, stream), "cuda::copy",
             "cudaMemcpyAsync");
}

void add(const Tensor& out, const Tensor& a, const Tensor& b, cudaStream_t stream) {
  constexpr const char* op = "cuda::add";
  check_op_arg(a, op, "a", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  check_op_arg(b, op, "b", Device::CUDA, {a.dtype}, {a.shape[0], a.shape[1]});
  check_op_arg(out, op, "out", Device::CUDA, {a.dtype}, {a.shape[0], a.shape[1]});
  dispatch_data(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const AddBody<T> body{out.ptr<T>(), a.ptr<T>(), b.ptr<T>()};
    launch_flat<T>(a.numel(), aligned16(out.data, a.data, b.data), body, stream, op);
  });
}

}  // namespace tandem::cuda
