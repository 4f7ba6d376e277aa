#include "world/gpu.h"

#include <stdexcept>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem {

#ifdef TANDEM_HAVE_CUDA
namespace {
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
}  // namespace

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // a missing driver is an answer here, not an error
    return 0;
  }
  return count;
}

void bind_gpu(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaFree(nullptr), "creating the CUDA context");
}
int bound_gpu() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

GpuInfo gpu_info(int device) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  GpuInfo info;
  info.name = properties.name;
  info.multiprocessors = properties.multiProcessorCount;
  info.major = properties.major;
  info.minor = properties.minor;
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current == device) check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  else info.total_bytes = properties.totalGlobalMem;
  return info;
}
size_t gpu_free_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return free_bytes;
}
size_t gpu_used_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return total_bytes - free_bytes;
}
#else
int gpu_count() { return 0; }
size_t gpu_free_memory() { throw std::runtime_error("this tandem was built without CUDA"); }
size_t gpu_used_memory() { throw std::runtime_error("this tandem was built without CUDA"); }
void bind_gpu(int) { throw std::runtime_error("this tandem was built without CUDA"); }
int bound_gpu() { throw std::runtime_error("this tandem was built without CUDA"); }
GpuInfo gpu_info(int) { throw std::runtime_error("this tandem was built without CUDA"); }
#endif

}  // namespace tandem
