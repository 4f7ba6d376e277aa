// The AdamW kernels against their CPU twin: bit for bit, on fresh random state.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <random>

#include "adamw.cuh"
#include "support.h"

using namespace tandem;

namespace {

void expect_matches_cpu_twin(size_t n) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = normal(rng), g[i] = normal(rng) * 1e-2f, m[i] = normal(rng) * 1e-3f, v[i] = std::fabs(normal(rng)) * 1e-5f;
  }
  float* device[4];
  uint16_t* working = nullptr;
  for (auto& d : device) ASSERT_EQ(cudaMalloc(&d, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&working, n * 2), cudaSuccess);
  const std::vector<float>* host[4] = {&p, &g, &m, &v};
  for (int i = 0; i < 4; ++i) cudaMemcpy(device[i], host[i]->data(), n * 4, cudaMemcpyHostToDevice);
  const AdamWSettings settings{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<uint16_t> cpu_working(n);
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWStepScalars k = adamw_scalars(settings, step, step != 2);
    cuda::adamw_step(device[0], device[1], device[2], device[3], n, k, working, nullptr);
    adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), n, k, cpu_working.data());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(n);
  const std::vector<float>* expected[4] = {&p, &g, &m, &v};
  const char* names[4] = {"params", "grads", "exp_avg", "exp_avg_sq"};
  for (int t = 0; t < 4; ++t) {
    cudaMemcpy(out.data(), device[t], n * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], (*expected[t])[i]) << names[t] << "[" << i << "] seed " << seed;
  }
  std::vector<uint16_t> gpu_working(n);
  cudaMemcpy(gpu_working.data(), working, n * 2, cudaMemcpyDeviceToHost);
  EXPECT_EQ(gpu_working, cpu_working) << "seed " << seed;
  for (auto& d : device) cudaFree(d);
  cudaFree(working);
}

}  // namespace

// A length of whole 4-element packs takes the vector kernel, any other the scalar one.
TEST(GpuAdamW, MatchesCpuTwinBitForBit) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (const size_t n : {(size_t{1} << 20) + 36, (size_t{1} << 20) + 37}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_matches_cpu_twin(n);
  }
}

// Runs over one slab: more than one launch's worth (128), decayed and not, with gaps
// between them that must stay as they were; whole aligned packs take the vector kernel,
// an odd offset anywhere the scalar one.
TEST(GpuAdamW, RunsMatchCpuTwinBitForBitAndLeaveGapsAlone) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (const bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "whole packs" : "an odd offset");
    const unsigned seed = std::random_device{}();
    std::mt19937 rng(seed);
    std::vector<AdamWRun> runs;
    int64_t n = 0;
    for (int r = 0; r < 300; ++r) {
      const int64_t gap = 4 * static_cast<int64_t>(rng() % 3), count = 4 * (1 + static_cast<int64_t>(rng() % 700));
      runs.push_back({n + gap, count, rng() % 2 == 0});
      n += gap + count;
    }
    if (!packed) runs[200].offset += 1, runs[200].count -= 1;
    std::normal_distribution<float> normal;
    std::vector<float> p(n), g(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = normal(rng), g[i] = normal(rng) * 1e-2f, m[i] = normal(rng) * 1e-3f, v[i] = std::fabs(normal(rng)) * 1e-5f;
    }
    std::vector<uint16_t> cpu_working(n, 0x7fc0);  // NaN bits where no run writes
    float* device[4];
    uint16_t* working = nullptr;
    for (auto& d : device) ASSERT_EQ(cudaMalloc(&d, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&working, n * 2), cudaSuccess);
    const std::vector<float>* host[4] = {&p, &g, &m, &v};
    for (int i = 0; i < 4; ++i) cudaMemcpy(device[i], host[i]->data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(working, cpu_working.data(), n * 2, cudaMemcpyHostToDevice);
    const AdamWSettings settings{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int64_t step = 1; step <= 2; ++step) {
      const AdamWStepScalars decayed = adamw_scalars(settings, step, true), plain = adamw_scalars(settings, step, false);
      cuda::adamw_step_runs(device[0], device[1], device[2], device[3], runs, decayed, plain, working, nullptr);
      for (const AdamWRun& run : runs)
        adamw_step_cpu(p.data() + run.offset, g.data() + run.offset, m.data() + run.offset, v.data() + run.offset,
                       static_cast<size_t>(run.count), run.decayed ? decayed : plain, cpu_working.data() + run.offset);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> out(n);
    const char* names[4] = {"params", "grads", "exp_avg", "exp_avg_sq"};
    for (int t = 0; t < 4; ++t) {
      cudaMemcpy(out.data(), device[t], n * 4, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], (*host[t])[i]) << names[t] << "[" << i << "] seed " << seed;
    }
    std::vector<uint16_t> gpu_working(n);
    cudaMemcpy(gpu_working.data(), working, n * 2, cudaMemcpyDeviceToHost);
    EXPECT_EQ(gpu_working, cpu_working) << "seed " << seed;
    for (auto& d : device) cudaFree(d);
    cudaFree(working);
  }
}
