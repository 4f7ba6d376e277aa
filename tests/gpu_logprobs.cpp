// The fused log-prob kernels against the CPU twin (cross_entropy on logits / temperature),
// on fresh random logits, F32 and BF16, with rows that have no target.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <random>

#include "logprobs.cuh"
#include "model/cross_entropy.h"
#include "support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"

using namespace tandem;

namespace {

struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(data); }
};

void check_case(int64_t T, int64_t V, DType dtype, float temperature) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " T=" + std::to_string(T) + " V=" + std::to_string(V));
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(T * V);
  for (auto& x : logits) x = normal(rng);
  if (dtype == DType::BF16)
    for (auto& x : logits) x = bf16_to_float(float_to_bf16(x));  // both sides see the same values
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = t % 5 == 4 ? -1 : static_cast<int32_t>(rng() % V);
  std::vector<float> dlogp(T);
  for (auto& d : dlogp) d = normal(rng);

  // CPU twin, one row at a time: cross_entropy of logits/T gives -logp and, with
  // scale = -dlogp/T, the gradient with respect to the logits.
  std::vector<float> ref_logp(T), ref_dlogits(T * V);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    for (auto& x : row) x /= temperature;
    const Tensor row_t = Tensor::view(row.data(), DType::F32, Device::CPU, {1, V});
    const int32_t target[1] = {targets[t]};
    ref_logp[t] = static_cast<float>(-cross_entropy(row_t, target, Tensor{}));
    cross_entropy(row_t, target, row_t, -dlogp[t] / temperature);
    std::copy(row.begin(), row.end(), ref_dlogits.begin() + t * V);
  }

  const size_t element = dtype_size(dtype);
  DeviceBuffer d_logits(T * V * element), d_targets(T * 4), d_logp(T * 4), d_lse(T * 4), d_dlogp(T * 4);
  const Tensor logits_t = Tensor::view(d_logits.data, dtype, Device::CUDA, {T, V});
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(T * V);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(logits[i]);
    copy_host_to_tensor(logits_t, bits.data());
  } else {
    copy_host_to_tensor(logits_t, logits.data());
  }
  const Tensor targets_t = Tensor::view(d_targets.data, DType::I32, Device::CUDA, {T});
  const Tensor logp_t = Tensor::view(d_logp.data, DType::F32, Device::CUDA, {T});
  const Tensor lse_t = Tensor::view(d_lse.data, DType::F32, Device::CUDA, {T});
  const Tensor dlogp_t = Tensor::view(d_dlogp.data, DType::F32, Device::CUDA, {T});
  copy_host_to_tensor(targets_t, targets.data());
  copy_host_to_tensor(dlogp_t, dlogp.data());
  cuda::token_logprobs_forward(logp_t, lse_t, logits_t, targets_t, temperature, nullptr);
  cuda::token_logprobs_backward(logits_t, logits_t, targets_t, lse_t, dlogp_t, temperature, nullptr);  // in place
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<float> logp(T);
  copy_tensor_to_host(logp.data(), logp_t);
  // FP32 accumulation over up to 151,936 exponentials: 1e-4 relative to log V.
  for (int64_t t = 0; t < T; ++t) ASSERT_NEAR(logp[t], ref_logp[t], 1e-4 * (1 + std::fabs(ref_logp[t]))) << t << " seed " << seed;
  std::vector<float> dlogits(T * V);
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(T * V);
    copy_tensor_to_host(bits.data(), logits_t);
    for (size_t i = 0; i < bits.size(); ++i) dlogits[i] = bf16_to_float(bits[i]);
  } else {
    copy_tensor_to_host(dlogits.data(), logits_t);
  }
  // F32: 1e-6 absolute (probabilities are at most 1); BF16 output: half an ulp (2^-9) relative.
  const double rel = dtype == DType::BF16 ? 1.0 / 256 : 1e-5;
  for (size_t i = 0; i < dlogits.size(); ++i)
    ASSERT_NEAR(dlogits[i], ref_dlogits[i], 1e-6 + rel * std::fabs(ref_dlogits[i])) << i << " seed " << seed;
}

}  // namespace

TEST(GpuLogprobs, MatchCpuTwinF32AndBf16) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (DType dtype : {DType::F32, DType::BF16}) {
    check_case(37, 1000, dtype, 0.7f);
    check_case(5, 151936, dtype, 1.0f);
    check_case(1, 3, dtype, 1.3f);
  }
}
