// The policy a run starts from (model/initial_weights.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/initial_weights.h"

using namespace tandem;

// The seeded random policy: the same weights on any number of threads (each chunk has
// its own generator), another seed gives others, N(0, 0.02) matrices, ones for norms.
TEST(InitialWeights, TheRandomPolicyIsTheSameOnAnyNumberOfThreads) {
  ModelConfig config = ModelConfig::qwen3_0_6b(1);
  config.vocab = 4096;  // an embedding of 4 chunks
  const ParameterLayout layout(config);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = random_initial_weights(layout, 7);
  omp_set_num_threads(2);
  const std::vector<float> two = random_initial_weights(layout, 7);
  omp_set_num_threads(threads);
  EXPECT_TRUE(one == two);
  EXPECT_FALSE(one == random_initial_weights(layout, 8));
  for (const ParameterInfo& info : layout.tensors()) {
    const float* values = one.data() + info.offset;
    if (info.name.find("norm.weight") != std::string::npos) {
      EXPECT_TRUE(std::all_of(values, values + info.numel(), [](float v) { return v == 1.0f; })) << info.name;
      continue;
    }
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < info.numel(); ++i) sum += values[i], squares += double(values[i]) * values[i];
    const double n = static_cast<double>(info.numel());
    EXPECT_NEAR(sum / n, 0.0, 0.002) << info.name;
    EXPECT_NEAR(std::sqrt(squares / n), 0.02, 0.001) << info.name;
  }
}
