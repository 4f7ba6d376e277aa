// The gradient norm and scaling kernels against their CPU twins: the square sum to
// double rounding and the same bits on every run, the scaling bit for bit.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <random>
#include <vector>

#include "gradient_clipping.cuh"
#include "gpu_support.h"
#include "train/gradient_clipping.h"

using namespace tandem;
using tandem::testing::DeviceBuffer;

namespace {

double device_square_sum(const float* data, size_t count, double* scratch) {
  cuda::square_sum(scratch, scratch + 1, data, count, nullptr);
  double sum = 0;
  EXPECT_EQ(cudaMemcpy(&sum, scratch, sizeof sum, cudaMemcpyDeviceToHost), cudaSuccess);
  return sum;
}

}  // namespace

TEST(GpuGradientClipping, SquareSumMatchesTheCpuAndRepeatsExactly) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  DeviceBuffer scratch((cuda::kSquareSumBlocks + 1) * sizeof(double));
  auto* partials = static_cast<double*>(scratch.data);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1e-2f);
  // Empty, smaller than one block, and larger than the grid covers in one sweep, ragged.
  for (size_t count : {size_t{0}, size_t{7}, size_t{3'000'001}}) {
    std::vector<float> host(count);
    for (auto& x : host) x = normal(rng);
    DeviceBuffer data(std::max<size_t>(count, 1) * 4);
    ASSERT_EQ(cudaMemcpy(data.data, host.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const std::span<float> slabs[] = {host};
    const double cpu = gradient_square_sum(slabs);
    const double gpu = device_square_sum(static_cast<float*>(data.data), count, partials);
    EXPECT_NEAR(gpu, cpu, 1e-10 * cpu) << count;
    for (int run = 0; run < 3; ++run)
      EXPECT_EQ(device_square_sum(static_cast<float*>(data.data), count, partials), gpu) << count;
  }
}

TEST(GpuGradientClipping, ScaleMatchesTheCpuBitForBit) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  const size_t count = 1'000'003;
  std::vector<float> host(count);
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : host) x = normal(rng);
  DeviceBuffer data(count * 4);
  ASSERT_EQ(cudaMemcpy(data.data, host.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const float factor = 0.3f / 1.7f;
  cuda::scale(static_cast<float*>(data.data), count, factor, nullptr);
  const std::span<float> slabs[] = {host};
  scale_gradients(slabs, factor);
  std::vector<float> scaled(count);
  ASSERT_EQ(cudaMemcpy(scaled.data(), data.data, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(scaled.data(), host.data(), count * 4), 0);
}
