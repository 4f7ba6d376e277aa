#include "tensor/device_copy.h"

#include <cstring>
#include <stdexcept>

#include "tensor/bf16.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "convert.cuh"
#endif

namespace tandem {

namespace {
#ifdef TANDEM_HAVE_CUDA
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
#endif

void require_contiguous(const Tensor& t, const char* what) {
  if (!t.is_contiguous()) throw std::invalid_argument(std::string(what) + ": tensor " + t.describe() + " is not contiguous");
}
}  // namespace

void copy_host_to_tensor(const Tensor& dst, const void* src) {
  require_contiguous(dst, "copy_host_to_tensor");
  if (dst.device == Device::CPU) {
    std::memcpy(dst.data, src, dst.nbytes());
    return;
  }
#ifdef TANDEM_HAVE_CUDA
  check_cuda(cudaMemcpy(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice), "copy to device");
#else
  throw std::runtime_error("copy_host_to_tensor: CUDA tensor in a CPU-only build");
#endif
}

void copy_tensor_to_host(void* dst, const Tensor& src) {
  require_contiguous(src, "copy_tensor_to_host");
  if (src.device == Device::CPU) {
    std::memcpy(dst, src.data, src.nbytes());
    return;
  }
#ifdef TANDEM_HAVE_CUDA
  check_cuda(cudaMemcpy(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost), "copy to host");
#else
  throw std::runtime_error("copy_tensor_to_host: CUDA tensor in a CPU-only build");
#endif
}

void copy_floats_to_tensor(const Tensor& dst, const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != dst.numel() || (dst.dtype != DType::F32 && dst.dtype != DType::BF16))
    throw std::invalid_argument("copy_floats_to_tensor: " + std::to_string(values.size()) + " floats into " +
                                dst.describe());
  if (dst.dtype == DType::F32) return copy_host_to_tensor(dst, values.data());
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  copy_host_to_tensor(dst, bits.data());
}

void convert_f32(const Tensor& dst, const Tensor& src) {
  if (src.dtype != DType::F32 || (dst.dtype != DType::F32 && dst.dtype != DType::BF16) || dst.numel() != src.numel() ||
      dst.device != src.device)
    throw std::invalid_argument("convert_f32: cannot convert " + src.describe() + " into " + dst.describe());
  const size_t n = static_cast<size_t>(src.numel());
  if (src.device == Device::CUDA) {
#ifdef TANDEM_HAVE_CUDA
    if (dst.dtype == DType::F32)
      // Default, not DeviceToDevice: src may be an offloaded slab's mapped pinned host copy.
      check_cuda(cudaMemcpy(dst.data, src.data, src.nbytes(), cudaMemcpyDefault), "convert_f32 copy");
    else
      convert_f32_to_bf16_cuda(dst.ptr<uint16_t>(), src.ptr<float>(), n, nullptr);
    check_cuda(cudaDeviceSynchronize(), "convert_f32");
    return;
#else
    throw std::runtime_error("convert_f32: CUDA tensor in a CPU-only build");
#endif
  }
  if (dst.dtype == DType::F32) {
    std::memcpy(dst.data, src.data, src.nbytes());
    return;
  }
  const float* in = src.ptr<float>();
  uint16_t* out = dst.ptr<uint16_t>();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

}  // namespace tandem
