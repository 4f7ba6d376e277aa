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

// Over the elements of x [N, W]; a pack of M elements is copied as it is into the part
// its columns fall in. Packs are used only when every part is a whole number of them,
// so that none straddles two parts (or two rows).
template <class T>
struct SplitColumnsBody {
  const T* x;
  int64_t width;  // W
  T* parts[kMaxSplitParts];
  int64_t ends[kMaxSplitParts];  // the column after part p, ascending; the last is W
  template <int M>
  __device__ void apply(int64_t i) const {
    const int64_t row = i / width, column = i - row * width;
    int p = 0;
    while (column >= ends[p]) ++p;
    const int64_t begin = p ? ends[p - 1] : 0;
    T* to = parts[p] + row * (ends[p] - begin) + (column - begin);
    *reinterpret_cast<Pack<T, M>*>(to) = *reinterpret_cast<const Pack<T, M>*>(x + i);
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

void split_columns(const std::vector<Tensor>& parts, const Tensor& x, cudaStream_t stream) {
  constexpr const char* op = "cuda::split_columns";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  if (parts.empty() || parts.size() > kMaxSplitParts)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(parts.size()) + " parts, not 1 to " +
                                std::to_string(kMaxSplitParts));
  int64_t widths = 0;
  for (const Tensor& part : parts) {
    check_op_arg(part, op, "parts", Device::CUDA, {x.dtype}, {x.shape[0], kAnyExtent});
    widths += part.shape[1];
  }
  if (widths != x.shape[1])
    throw std::invalid_argument(std::string(op) + ": parts of " + std::to_string(widths) + " columns in all for " +
                                x.describe());
  dispatch_data(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    SplitColumnsBody<T> body{x.ptr<T>(), x.shape[1], {}, {}};
    bool aligned = aligned16(x.data);
    int64_t end = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      body.parts[p] = parts[p].ptr<T>();
      body.ends[p] = end += parts[p].shape[1];
      aligned = aligned && aligned16(parts[p].data) && parts[p].shape[1] % kPack<T> == 0;
    }
    launch_flat<T>(x.numel(), aligned, body, stream, op);
  });
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
