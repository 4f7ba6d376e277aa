// Moving tensor bytes between the host and a backend's memory, and the one dtype
// conversion the driver needs (FP32 master weights -> the working/engine dtype),
// without the caller knowing which backend holds the tensor.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace tandem {

void copy_host_to_tensor(const Tensor& dst, const void* src);
void copy_tensor_to_host(void* dst, const Tensor& src);
// dst (F32 or BF16, any device) = host FP32 values, rounded as the GPU rounds (nearest even).
void copy_floats_to_tensor(const Tensor& dst, const std::vector<float>& values);
// dst (F32 or BF16) = src (F32), same element count, same device; waits for completion.
void convert_f32(const Tensor& dst, const Tensor& src);

}  // namespace tandem
