// Programmatic dependent launch (Hopper): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it
// in the stream still runs, once every block of that one has called allow_dependents() or
// exited. It must call wait_for_prior_grid() before it touches anything the kernel before
// writes; the wait returns once that kernel has finished and its writes are visible. Work
// before the wait (reading what older kernels wrote) overlaps the kernel before's tail,
// which at decode sizes is a large share of a small kernel's time. Both calls are no-ops
// in a kernel launched the ordinary way, and stream capture keeps the overlap in a CUDA
// graph.
#pragma once

namespace tandem::cuda {

// Called first by the kernels a decode step's projections follow (the norms, SwiGLU, the
// attention): their blocks are all resident by the time each has called it, so the
// projection's blocks take the multiprocessors their blocks leave, with no wave of theirs
// still waiting for room.
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace tandem::cuda
