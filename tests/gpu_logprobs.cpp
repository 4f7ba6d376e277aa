// The fused log-prob kernels against the CPU twin (the trainer's chunked log-probs, in
// double), on fresh random logits, F32 and BF16, with rows that have no target, with and
// without the entropy and its gradient.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "logprobs.cuh"
#include "gpu_support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "train/chunked_logprobs.h"

using namespace tandem;
using tandem::testing::DeviceBuffer;

namespace {

void check_case(int64_t T, int64_t V, DType dtype, float temperature, bool with_entropy) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " T=" + std::to_string(T) + " V=" + std::to_string(V) +
               (with_entropy ? " entropy" : ""));
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(T * V);
  for (auto& x : logits) x = normal(rng);
  if (dtype == DType::BF16)
    for (auto& x : logits) x = bf16_to_float(float_to_bf16(x));  // both sides see the same values
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = t % 5 == 4 ? -1 : static_cast<int32_t>(rng() % V);
  std::vector<float> dlogp(T), dentropy(with_entropy ? T : 0);
  for (auto& d : dlogp) d = normal(rng);
  for (auto& d : dentropy) d = normal(rng) / 3;

  // CPU twin on the same values in F32, its gradient unrounded.
  std::vector<float> ref_logp(T), ref_entropy(with_entropy ? T : 0), ref_dlogits(logits);
  const Tensor ref_t = Tensor::view(ref_dlogits.data(), DType::F32, Device::CPU, {T, V});
  const LogprobSettings settings{temperature, 16};
  std::vector<float> workspace(logprob_workspace_elements(T, V, settings.chunk_tokens));
  chunked_logprobs_forward(ref_t, targets, settings, workspace, ref_logp, ref_entropy);
  chunked_logprobs_backward(ref_t, targets, settings, workspace, dlogp, dentropy, ref_t);

  const size_t element = dtype_size(dtype);
  DeviceBuffer d_logits(T * V * element), d_targets(T * 4), d_logp(T * 4), d_entropy(T * 4), d_lse(T * 4),
      d_dlogp(T * 4), d_dentropy(T * 4);
  const Tensor logits_t = Tensor::view(d_logits.data, dtype, Device::CUDA, {T, V});
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(T * V);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(logits[i]);
    copy_host_to_tensor(logits_t, bits.data());
  } else {
    copy_host_to_tensor(logits_t, logits.data());
  }
  auto vector_t = [&](const DeviceBuffer& buffer, DType type) { return Tensor::view(buffer.data, type, Device::CUDA, {T}); };
  const Tensor targets_t = vector_t(d_targets, DType::I32), logp_t = vector_t(d_logp, DType::F32),
               lse_t = vector_t(d_lse, DType::F32), dlogp_t = vector_t(d_dlogp, DType::F32);
  const Tensor entropy_t = with_entropy ? vector_t(d_entropy, DType::F32) : Tensor{};
  const Tensor dentropy_t = with_entropy ? vector_t(d_dentropy, DType::F32) : Tensor{};
  copy_host_to_tensor(targets_t, targets.data());
  copy_host_to_tensor(dlogp_t, dlogp.data());
  if (with_entropy) copy_host_to_tensor(dentropy_t, dentropy.data());
  cuda::token_logprobs_forward(logp_t, entropy_t, lse_t, logits_t, targets_t, temperature, nullptr);
  cuda::token_logprobs_backward(logits_t, logits_t, targets_t, lse_t, entropy_t, dlogp_t, dentropy_t, temperature,
                                nullptr);  // in place
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // FP32 accumulation over up to 151,936 exponentials: 1e-4 relative to log V.
  std::vector<float> logp(T), entropy(T);
  copy_tensor_to_host(logp.data(), logp_t);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_NEAR(logp[t], ref_logp[t], 1e-4 * (1 + std::fabs(ref_logp[t]))) << t << " seed " << seed;
  if (with_entropy) {
    copy_tensor_to_host(entropy.data(), entropy_t);
    for (int64_t t = 0; t < T; ++t)
      ASSERT_NEAR(entropy[t], ref_entropy[t], 1e-4 * (1 + ref_entropy[t])) << t << " seed " << seed;
  }
  std::vector<float> dlogits(T * V);
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(T * V);
    copy_tensor_to_host(bits.data(), logits_t);
    for (size_t i = 0; i < bits.size(); ++i) dlogits[i] = bf16_to_float(bits[i]);
  } else {
    copy_tensor_to_host(dlogits.data(), logits_t);
  }
  // Per element: the output's rounding (F32: 1e-5 relative; BF16: half an ulp, 2^-9)
  // plus FP32 error in the row's log-sum-exp, at most 1e-5 of the row's largest value.
  // The entropy term, dentropy * p_v * (log p_v + H) / temperature, cancels: its FP32 error
  // is relative to the terms before the cancellation, p_v * (|log p_v| + H).
  const double rel = dtype == DType::BF16 ? 1.0 / 256 : 1e-5;
  for (int64_t t = 0; t < T; ++t) {
    const float* ref_row = ref_dlogits.data() + t * V;
    float row_max = 0;
    for (int64_t v = 0; v < V; ++v) row_max = std::max(row_max, std::fabs(ref_row[v]));
    double lse = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      const double z = logits[t * V + v] / temperature;
      lse = std::max(lse, z) + std::log1p(std::exp(-std::fabs(lse - z)));
    }
    for (int64_t v = 0; v < V; ++v) {
      const double logp_v = logits[t * V + v] / temperature - lse;
      const double entropy_terms =
          with_entropy ? std::fabs(dentropy[t]) * std::exp(logp_v) * (std::fabs(logp_v) + ref_entropy[t]) / temperature : 0.0;
      ASSERT_NEAR(dlogits[t * V + v], ref_row[v], 1e-6 + rel * std::fabs(ref_row[v]) + 1e-5 * row_max + 1e-5 * entropy_terms)
          << "row " << t << " column " << v << " seed " << seed;
    }
  }
}

}  // namespace

// Row lengths whose rows all start on 16 bytes (1000, 151936: packs only), or not (1001:
// elements before and after the packs, other counts on each row), and a row shorter than
// a pack (3).
TEST(GpuLogprobs, MatchCpuTwinF32AndBf16) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (bool with_entropy : {false, true})
    for (DType dtype : {DType::F32, DType::BF16}) {
      check_case(37, 1000, dtype, 0.7f, with_entropy);
      check_case(9, 1001, dtype, 0.7f, with_entropy);  // rows off the 16-byte boundary: a head and a tail
      check_case(5, 151936, dtype, 1.0f, with_entropy);
      check_case(1, 3, dtype, 1.3f, with_entropy);
    }
}
