// The block sum of doubles that the norm kernels (gradient clipping, Muon) share: a tree
// over shared memory in a fixed order, so a sum does not depend on warp scheduling and a
// run repeats bit for bit. Included by kernels/*.cu only.
#pragma once

namespace tandem::cuda {

// Sums one value from each of the block's Threads threads (blockDim.x == Threads, a power
// of two); every thread gets the total. One call per kernel: the shared array is reused.
template <int Threads>
__device__ double block_sum(double value) {
  __shared__ double shared[Threads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = Threads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

}  // namespace tandem::cuda
