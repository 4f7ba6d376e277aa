// The first gradient tensor holding a NaN or an infinity, found through the backend's
// squared-norm reduction (the CPU twin of gpu_nonfinite_gradients.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "policy_trainer_support.h"
#include "train/nonfinite_gradients.h"

using namespace tandem;

TEST(NonFiniteGradients, NamesTheFirstTensorInLayoutOrderOnTheCpu) {
  const ParameterLayout layout(tandem::testing::trainer_config());
  std::vector<float> grads(static_cast<size_t>(layout.slab_elements()), 0.5f);
  const Tensor slab = Tensor::view(grads.data(), DType::F32, Device::CPU, {layout.slab_elements()});
  const auto backend = make_cpu_trainer_backend();
  EXPECT_EQ(first_non_finite_gradient(*backend, slab, layout), "");
  const ParameterInfo& late = layout.tensors().back();
  const ParameterInfo& early = layout.tensors()[2];
  grads[late.offset + late.numel() - 1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(first_non_finite_gradient(*backend, slab, layout), late.name);
  grads[early.offset + 1] = std::nanf("");
  EXPECT_EQ(first_non_finite_gradient(*backend, slab, layout), early.name);
}
