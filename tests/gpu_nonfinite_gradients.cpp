// The first gradient tensor holding a NaN or an infinity on the CUDA backend: the same
// answers as the CPU twin (test_nonfinite_gradients.cpp) on the same slab.
#include <cmath>
#include <limits>

#include "gpu_support.h"
#include "policy_trainer_support.h"
#include "train/nonfinite_gradients.h"

using namespace tandem;

TEST(GpuNonFiniteGradients, NamesTheSameTensorAsTheCpu) {
  REQUIRE_GPU();
  const ParameterLayout layout(tandem::testing::trainer_config());
  std::vector<float> grads(static_cast<size_t>(layout.slab_elements()), 0.5f);
  tandem::testing::DeviceBuffer device(grads.size() * sizeof(float));
  const Tensor cpu_slab = Tensor::view(grads.data(), DType::F32, Device::CPU, {layout.slab_elements()});
  const Tensor gpu_slab = Tensor::view(device.data, DType::F32, Device::CUDA, {layout.slab_elements()});
  const auto cpu = make_cpu_trainer_backend();
  const auto gpu = make_cuda_trainer_backend();
  auto both = [&] {
    tandem::testing::check(cudaMemcpy(device.data, grads.data(), grads.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
    const std::string expected = first_non_finite_gradient(*cpu, cpu_slab, layout);
    EXPECT_EQ(first_non_finite_gradient(*gpu, gpu_slab, layout), expected);
    return expected;
  };
  EXPECT_EQ(both(), "");
  const ParameterInfo& late = layout.tensors().back();
  grads[late.offset + late.numel() - 1] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(both(), late.name);
  grads[layout.tensors()[1].offset] = std::nanf("");
  EXPECT_EQ(both(), layout.tensors()[1].name);
}
