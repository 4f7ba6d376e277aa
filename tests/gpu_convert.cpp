// FP32 -> BF16 on the GPU against its CPU twin, bit for bit, on fresh random inputs
// with the edge cases (ties, NaN, infinities, subnormals) mixed in.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "tensor/memory_pool.h"

using namespace tandem;

TEST(GpuConvert, F32ToBf16MatchesCpuTwinBitForBit) {
  if (!tandem::testing::cuda_device_available()) GTEST_SKIP() << "no GPU";
  auto pool = MemoryPool::create(Device::CUDA, 0);
  const size_t n = (size_t{1} << 22) + 3;  // an odd tail exercises the scalar path
  std::vector<float> input(n);
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 3.f);
  for (auto& x : input) x = normal(rng);
  const float specials[] = {0.f, -0.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-40f, -1e-42f, 1.00390625f /* a tie */,
                            std::numeric_limits<float>::max()};
  for (size_t i = 0; i < std::size(specials); ++i) input[i * 997] = specials[i];

  Allocation* src = pool->allocate(tags::activations, n * 4, "convert.src");
  Allocation* dst = pool->allocate(tags::activations, n * 2, "convert.dst");
  const Tensor src_t = Tensor::view(src->ptr, DType::F32, Device::CUDA, {static_cast<int64_t>(n)});
  const Tensor dst_t = Tensor::view(dst->ptr, DType::BF16, Device::CUDA, {static_cast<int64_t>(n)});
  copy_host_to_tensor(src_t, input.data());
  convert_f32(dst_t, src_t);
  std::vector<uint16_t> output(n);
  copy_tensor_to_host(output.data(), dst_t);
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(input[i])) {
      ASSERT_TRUE(std::isnan(bf16_to_float(output[i]))) << i;
      continue;
    }
    ASSERT_EQ(output[i], float_to_bf16(input[i])) << "element " << i << " = " << input[i];
  }
}
