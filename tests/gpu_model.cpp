// The whole decoder on CUDA against the FP32 CPU reference: logits, loss and every
// parameter gradient, for F32 (tight) and BF16 (the production precision) data.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <numeric>

#include "logprobs.cuh"
#include "model/cross_entropy.h"
#include "model/cuda_ops.h"
#include "gpu_support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "test_model_support.h"

using namespace tandem;
using tandem::testing::DeviceBuffer;

namespace {

ModelConfig gpu_config(bool qk_norm, bool qkv_bias, bool tied) {
  return tandem::testing::gpu_sized(tandem::testing::tiny_config(qk_norm, qkv_bias, tied));
}

std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> out(t.numel());
  if (t.dtype == DType::F32) {
    copy_tensor_to_host(out.data(), t);
  } else {
    std::vector<uint16_t> bits(t.numel());
    copy_tensor_to_host(bits.data(), t);
    for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  }
  return out;
}

// ||a - b|| / ||b||: one number per tensor, robust to the many near-zero entries.
double relative_error(const std::vector<float>& a, const float* b, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

void compare_with_cpu(bool qk_norm, bool qkv_bias, bool tied, DType dtype, double logits_tolerance,
                      double grad_tolerance) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + (qk_norm ? " qk_norm" : "") + (qkv_bias ? " bias" : "") +
               (tied ? " tied" : ""));
  const ModelConfig config = gpu_config(qk_norm, qkv_bias, tied);
  const std::vector<int32_t> cu_seqlens = {0, 5, 22, 62};
  const int64_t T = cu_seqlens.back();
  const ActivationCapacity capacity{T, 3};
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(T);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % config.vocab);
  const std::vector<int32_t> targets = next_token_targets(ids, cu_seqlens);
  const auto counted = std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });

  // CPU reference in FP32.
  tandem::testing::TinyModel cpu(config, capacity, seed);
  if (dtype == DType::BF16)  // both sides start from the same rounded weights
    for (auto& w : cpu.weights) w = bf16_to_float(float_to_bf16(w));
  const Tensor cpu_logits = cpu.transformer.forward(cpu.params, cpu.acts, ids, cu_seqlens);
  const std::vector<float> reference_logits(cpu_logits.ptr<float>(), cpu_logits.ptr<float>() + cpu_logits.numel());
  const double cpu_loss = cross_entropy(cpu_logits, targets, cpu_logits, 1.0f / counted) / counted;
  cpu.zero_grads();
  cpu.transformer.backward(cpu.params, cpu.grads, cpu.acts, cpu_logits);

  // The same model on the GPU.
  CudaOps ops;
  const ParameterLayout& layout = cpu.layout;
  DeviceBuffer weights(layout.slab_bytes(dtype)), gradients(layout.slab_bytes(DType::F32));
  DeviceBuffer acts_slab(Activations::slab_bytes(config, capacity, dtype));
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(cpu.weights.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(cpu.weights[i]);
    cudaMemcpy(weights.data, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
  } else {
    cudaMemcpy(weights.data, cpu.weights.data(), cpu.weights.size() * 4, cudaMemcpyHostToDevice);
  }
  const ParameterSet params = ParameterSet::bind(layout, weights.data, dtype, Device::CUDA);
  const ParameterSet grads = ParameterSet::bind(layout, gradients.data, DType::F32, Device::CUDA);
  Activations acts = Activations::bind(config, capacity, acts_slab.data, dtype, Device::CUDA);
  Transformer transformer(config, ops);
  const Tensor logits = transformer.forward(params, acts, ids, cu_seqlens);
  ops.synchronize();
  const std::vector<float> gpu_logits = host_floats(logits);
  EXPECT_LT(relative_error(gpu_logits, reference_logits.data(), reference_logits.size()), logits_tolerance)
      << "logits, seed " << seed;

  DeviceBuffer d_targets(T * 4), d_logp(T * 4), d_lse(T * 4), d_dlogp(T * 4);
  const Tensor targets_t = Tensor::view(d_targets.data, DType::I32, Device::CUDA, {T});
  const Tensor logp = Tensor::view(d_logp.data, DType::F32, Device::CUDA, {T});
  const Tensor lse = Tensor::view(d_lse.data, DType::F32, Device::CUDA, {T});
  const Tensor dlogp = Tensor::view(d_dlogp.data, DType::F32, Device::CUDA, {T});
  copy_host_to_tensor(targets_t, targets.data());
  const std::vector<float> mean_weight(T, -1.0f / counted);  // loss = -mean logp
  copy_host_to_tensor(dlogp, mean_weight.data());
  cuda::token_logprobs_forward(logp, Tensor{}, lse, logits, targets_t, 1.0f, ops.stream());
  cuda::token_logprobs_backward(logits, logits, targets_t, lse, Tensor{}, dlogp, Tensor{}, 1.0f, ops.stream());
  transformer.backward(params, grads, acts, logits);
  ops.synchronize();
  const std::vector<float> token_logp = host_floats(logp);
  const double gpu_loss = -std::accumulate(token_logp.begin(), token_logp.end(), 0.0) / counted;
  EXPECT_NEAR(gpu_loss, cpu_loss, logits_tolerance * std::fabs(cpu_loss)) << "loss, seed " << seed;

  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    const ParameterInfo& info = layout.tensors()[i];
    const std::vector<float> grad = host_floats(grads.all[i]);
    EXPECT_LT(relative_error(grad, cpu.grads.all[i].ptr<float>(), grad.size()), grad_tolerance)
        << info.name << ", seed " << seed;
  }
}

}  // namespace

// F32 data: the kernels do the same arithmetic in another order (FP32 rounding only).
TEST(GpuModel, MatchesCpuReferenceInF32) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (int flags = 0; flags < 8; ++flags)
    compare_with_cpu(flags & 1, flags & 2, flags & 4, DType::F32, 1e-5, 1e-4);
}

// BF16 activations (8 bits of mantissa, rounded at every op boundary through 2 layers)
// against the FP32 reference from the same rounded weights: 2% relative L2 on logits and
// 5% per gradient tensor.
TEST(GpuModel, MatchesCpuReferenceInBf16) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  for (int flags = 0; flags < 8; ++flags)
    compare_with_cpu(flags & 1, flags & 2, flags & 4, DType::BF16, 2e-2, 5e-2);
}
