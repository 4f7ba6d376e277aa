// What the GPU tests share: skipping without a device, CUDA status checks that throw,
// and a zeroed device buffer owned by the test.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "support.h"

#define REQUIRE_GPU() \
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no CUDA device"

namespace tandem::testing {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    check(cudaMalloc(&data, std::max<size_t>(bytes, 1)), "cudaMalloc of a test buffer");
    check(cudaMemset(data, 0, bytes), "cudaMemset of a test buffer");
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace tandem::testing
