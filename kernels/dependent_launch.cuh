// Programmatic dependent launch (Hopper): a kernel launched with launch_dependent() may
// start while the kernel before it in the stream still runs, once every block of that one
// has called allow_dependents() (or exited). It must call wait_for_prior_grid() before it
// touches anything the kernel before writes; the wait returns once that kernel has
// finished and its writes are visible. Work before the wait (reading tables the host
// staged, loading data older kernels wrote) overlaps the kernel before's tail, which at
// decode sizes is most of a small kernel's time. Both calls are no-ops in a kernel
// launched the ordinary way, and stream capture keeps the overlap in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

namespace tandem::cuda {

__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to start early.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                             cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tandem::cuda
