// The few CUDA device facts the world needs; a CPU-only build answers "no GPUs".
#pragma once
#include <cstddef>
#include <string>

namespace tandem {

int gpu_count();  // 0 when built without CUDA or when no driver/device is usable
void bind_gpu(int device);
int bound_gpu();  // the GPU this thread is bound to (a new thread: 0), for another to bind
struct GpuInfo {
  std::string name;
  size_t total_bytes = 0;
  size_t free_bytes = 0;
  int multiprocessors = 0;
  int major = 0, minor = 0;
};
GpuInfo gpu_info(int device);
size_t gpu_free_memory();  // of the GPU this thread is bound to
size_t gpu_used_memory();  // total - free of that GPU (cudaMemGetInfo): every process's memory

}  // namespace tandem
