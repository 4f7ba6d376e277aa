// Muon's CUDA step against its FP32 CPU twin on fresh random inputs, over the groups of a
// small model (every layer's matrices of a shape in one batched call), and the
// orthogonality of the GPU's BF16 Newton-Schulz result.
#include <gtest/gtest.h>

#include <cublas_v2.h>

#include <cmath>
#include <random>

#include "gpu_support.h"
#include "muon.cuh"
#include "tensor/bf16.h"
#include "singular_values.h"
#include "test_model_support.h"
#include "train/muon.h"

using namespace tandem;
using tandem::testing::check;
using tandem::testing::DeviceBuffer;

namespace {

// A model with wide, tall and square matrices in several layers.
ModelConfig muon_config() {
  ModelConfig config = tandem::testing::tiny_config(true, false, true);
  config.layers = 3;
  config.hidden = 128;
  config.heads = 4;
  config.kv_heads = 2;
  config.head_dim = 64;  // q [256, 128] tall, k, v [128, 128], o [128, 256]
  config.intermediate = 384;
  return config;
}

struct Slabs {
  std::vector<float> params, grads, momentum;
};

Slabs random_slabs(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  Slabs s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) s.params[i] = 0.02f * normal(rng), s.grads[i] = 1e-3f * normal(rng), s.momentum[i] = 1e-3f * normal(rng);
  return s;
}

// Runs the CUDA step on every group; returns the device results.
Slabs gpu_step(const std::vector<MuonGroup>& groups, const Slabs& in, const MuonSettings& settings, std::vector<uint16_t>* working) {
  const size_t n = in.params.size();
  DeviceBuffer params(n * 4), grads(n * 4), momentum(n * 4), bf16(n * 2), workspace(MuonWorkspace::bytes_for(groups));
  check(cudaMemcpy(params.data, in.params.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(grads.data, in.grads.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(momentum.data, in.momentum.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  cublasHandle_t cublas = nullptr;
  EXPECT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  for (const MuonGroup& group : groups) {
    const MuonStepScalars scalars = muon_scalars(settings, group.m, group.n);
    cuda::muon_momentum(group, 0, group.matrices.size(), static_cast<const float*>(grads.data),
                        static_cast<float*>(momentum.data), nullptr, scalars.momentum, workspace.data, nullptr);
    cuda::muon_orthogonalize(group, static_cast<float*>(params.data), static_cast<uint16_t*>(bf16.data), scalars,
                             workspace.data, cublas, nullptr);
  }
  check(cudaDeviceSynchronize(), "Muon's step");
  cublasDestroy(cublas);
  Slabs out{std::vector<float>(n), in.grads, std::vector<float>(n)};
  check(cudaMemcpy(out.params.data(), params.data, n * 4, cudaMemcpyDeviceToHost), "download");
  check(cudaMemcpy(out.momentum.data(), momentum.data, n * 4, cudaMemcpyDeviceToHost), "download");
  if (working) {
    working->resize(n);
    check(cudaMemcpy(working->data(), bf16.data, n * 2, cudaMemcpyDeviceToHost), "download");
  }
  return out;
}

}  // namespace

// The momentum is the twin's bit for bit; the update O differs by the BF16 iteration
// (about 2^-9 per rounding, several roundings per iteration, and more in the directions
// of small singular values, which the iteration lifts): per matrix,
// |O_gpu - O_cpu|_F <= 5% of |O_cpu|_F. (A bound not yet run on a GPU.)
TEST(GpuMuon, MatchesTheCpuTwin) {
  REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const ParameterLayout layout(muon_config());
  const std::vector<MuonGroup> groups = muon_groups(layout);
  ASSERT_EQ(groups.size(), 3u);
  const Slabs in = random_slabs(static_cast<size_t>(layout.slab_elements()), rng);
  const MuonSettings settings{0.02, 0.95, 0.1};
  std::vector<uint16_t> working;
  const Slabs gpu = gpu_step(groups, in, settings, &working);
  Slabs cpu = in;
  std::vector<float> scratch;
  for (const MuonGroup& group : groups) {
    const MuonStepScalars k = muon_scalars(settings, group.m, group.n);
    for (const MuonMatrix& matrix : group.matrices) {
      const size_t at = static_cast<size_t>(matrix.offset), count = static_cast<size_t>(group.m * group.n);
      muon_step_cpu(cpu.params.data() + at, cpu.grads.data() + at, cpu.momentum.data() + at,
                    matrix.transposed ? group.n : group.m, matrix.transposed ? group.m : group.n, k, nullptr, scratch);
      double error = 0, norm = 0;
      for (size_t i = at; i < at + count; ++i) {
        ASSERT_EQ(gpu.momentum[i], cpu.momentum[i]) << "seed " << seed << " at " << i;
        ASSERT_EQ(working[i], float_to_bf16(gpu.params[i]));
        const double decayed = static_cast<double>(in.params[i]) * k.decay;
        const double o_gpu = (decayed - gpu.params[i]) / k.update_scale, o_cpu = (decayed - cpu.params[i]) / k.update_scale;
        error += (o_gpu - o_cpu) * (o_gpu - o_cpu);
        norm += o_cpu * o_cpu;
      }
      EXPECT_LE(std::sqrt(error), 0.05 * std::sqrt(norm))
          << group.m << "x" << group.n << " matrix at " << at << " seed " << seed;
    }
  }
}

// With momentum 0, no decay and a step of -1 from zero weights, the weights become the
// orthogonalised gradient itself. The square group is left out: a random square matrix
// has singular values near zero (relative to its norm) that five iterations cannot lift
// to 0.5; gradients, of low stable rank, do not.
TEST(GpuMuon, NewtonSchulzInBf16LeavesSingularValuesBetweenHalfAndOneAndAHalf) {
  REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const ParameterLayout layout(muon_config());
  const std::vector<MuonGroup> groups = muon_groups(layout);
  Slabs in = random_slabs(static_cast<size_t>(layout.slab_elements()), rng);
  std::fill(in.params.begin(), in.params.end(), 0.0f);
  std::fill(in.momentum.begin(), in.momentum.end(), 0.0f);
  // update_scale = lr * 0.2 sqrt(n) must be -1: lr = -1 / (0.2 sqrt(n)) per group.
  for (const MuonGroup& group : groups) {
    if (group.n < 2 * group.m) continue;
    const MuonSettings unit{-1.0 / (0.2 * std::sqrt(static_cast<double>(group.n))), 0, 0};
    const Slabs out = gpu_step({group}, in, unit, nullptr);
    for (const MuonMatrix& matrix : group.matrices) {
      const int64_t rows = matrix.transposed ? group.n : group.m, cols = matrix.transposed ? group.m : group.n;
      for (const double sigma : tandem::testing::singular_values(out.params.data() + matrix.offset, rows, cols)) {
        EXPECT_GE(sigma, 0.5) << rows << "x" << cols << " seed " << seed;
        EXPECT_LE(sigma, 1.5) << rows << "x" << cols << " seed " << seed;
      }
    }
  }
}
