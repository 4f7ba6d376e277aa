#include "elementwise.cuh"

#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

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

}  // namespace tandem::cuda
