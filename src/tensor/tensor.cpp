#include "tensor/tensor.h"

namespace tandem {

const char* device_name(Device device) { return device == Device::CUDA ? "cuda" : "cpu"; }

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

Tensor Tensor::view(void* data, DType dtype, Device device, std::vector<int64_t> shape) {
  Tensor tensor;
  tensor.data = data;
  tensor.dtype = dtype;
  tensor.device = device;
  tensor.strides = contiguous_strides(shape);
  tensor.shape = std::move(shape);
  return tensor;
}

int64_t Tensor::numel() const {
  int64_t count = 1;
  for (auto extent : shape) count *= extent;
  return count;
}

bool Tensor::is_contiguous() const { return strides == contiguous_strides(shape); }

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype)) + shape_string(shape) + " " + device_name(device) +
         (is_contiguous() ? "" : " (strided)");
}

}  // namespace tandem
