// The AdamW kernels against their CPU twin: bit for bit, on fresh random state.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <functional>
#include <random>

#include "adamw.cuh"
#include "support.h"

using namespace tandem;

namespace {

const AdamWSettings kSettings{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

// Three steps over a slab of n values, on the GPU by `gpu_step` and on the CPU over
// `runs`, then every buffer compared; values outside the runs must stay as they were
// (the working copy starts as NaN bits there).
void expect_matches_cpu_twin(
    int64_t n, const std::vector<AdamWRun>& runs, std::mt19937& rng, unsigned seed,
    const std::function<void(float* const*, uint16_t*, const AdamWStepScalars&, const AdamWStepScalars&)>& gpu_step) {
  std::normal_distribution<float> normal;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = normal(rng), g[i] = normal(rng) * 1e-2f, m[i] = normal(rng) * 1e-3f, v[i] = std::fabs(normal(rng)) * 1e-5f;
  }
  std::vector<uint16_t> cpu_working(n, 0x7fc0);
  float* device[4];
  uint16_t* working = nullptr;
  for (auto& d : device) ASSERT_EQ(cudaMalloc(&d, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&working, n * 2), cudaSuccess);
  const std::vector<float>* host[4] = {&p, &g, &m, &v};
  for (int i = 0; i < 4; ++i) cudaMemcpy(device[i], host[i]->data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(working, cpu_working.data(), n * 2, cudaMemcpyHostToDevice);
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWStepScalars decayed = adamw_scalars(kSettings, step, true);
    const AdamWStepScalars plain = adamw_scalars(kSettings, step, false);
    gpu_step(device, working, decayed, plain);
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

}  // namespace

// One tensor: a length of whole 4-element packs takes the vector kernel, any other the
// scalar one.
TEST(GpuAdamW, MatchesCpuTwinBitForBit) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (const int64_t n : {(int64_t{1} << 20) + 36, (int64_t{1} << 20) + 37}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const unsigned seed = std::random_device{}();
    std::mt19937 rng(seed);
    expect_matches_cpu_twin(n, {{0, n, true}}, rng, seed,
                            [&](float* const* d, uint16_t* working, const auto& decayed, const auto&) {
                              cuda::adamw_step(d[0], d[1], d[2], d[3], static_cast<size_t>(n), decayed, working,
                                               nullptr);
                            });
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
    expect_matches_cpu_twin(n, runs, rng, seed,
                            [&](float* const* d, uint16_t* working, const auto& decayed, const auto& plain) {
                              cuda::adamw_step_runs(d[0], d[1], d[2], d[3], runs, decayed, plain, working, nullptr);
                            });
  }
}
