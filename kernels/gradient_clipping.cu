#include "gradient_clipping.cuh"

#include <algorithm>

#include "block_sum.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void partial_square_sums(double* partials, const float* data, size_t count) {
  double sum = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(kThreads) + threadIdx.x; i < count;
       i += static_cast<size_t>(kSquareSumBlocks) * kThreads) {
    const double x = data[i];
    sum += x * x;
  }
  const double total = block_sum<kThreads>(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_partials(double* result, const double* partials) {
  double sum = 0;
  for (int i = threadIdx.x; i < kSquareSumBlocks; i += kThreads) sum += partials[i];
  const double total = block_sum<kThreads>(sum);
  if (threadIdx.x == 0) *result = total;
}

__global__ void scale_kernel(float* data, size_t count, float factor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    data[i] = __fmul_rn(data[i], factor);
}

}  // namespace

void square_sum(double* result, double* partials, const float* data, size_t count, cudaStream_t stream) {
  partial_square_sums<<<kSquareSumBlocks, kThreads, 0, stream>>>(partials, data, count);
  sum_partials<<<1, kThreads, 0, stream>>>(result, partials);
}

void scale(float* data, size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  const size_t blocks = std::min<size_t>((count + kThreads - 1) / kThreads, 132 * 16);
  scale_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(data, count, factor);
}

}  // namespace tandem::cuda
