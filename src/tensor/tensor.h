// A Tensor is a typed, shaped view of memory it does not own. Storage comes from the
// MemoryPool (tagged, offloadable) or from a file mapping; the view stays valid as long
// as that storage does, across offload/onload too, since pool addresses are stable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace tandem {

enum class Device { CPU, CUDA };
const char* device_name(Device device);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements

  // A contiguous row-major view.
  static Tensor view(void* data, DType dtype, Device device, std::vector<int64_t> shape);

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  bool is_contiguous() const;
  std::string describe() const;  // "BF16[28,1024] cuda"

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace tandem
