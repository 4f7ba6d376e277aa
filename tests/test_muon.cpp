// Muon on the CPU: which tensors it takes and how the CUDA path groups them; the
// Newton-Schulz result is nearly orthogonal; the FP32 twin against a PyTorch reference
// (tests/fixtures/muon, made by tools/fixtures/make_muon_fixture.py on the GPU machine);
// and the trainer's step under Muon: Muon for the matrices, AdamW for the rest.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "io/safetensors.h"
#include "policy_trainer_support.h"
#include "singular_values.h"
#include "support.h"
#include "train/muon.h"

namespace tandem {
namespace {

TEST(Muon, TakesTheLayersMatricesAndGroupsThemByOrientedShape) {
  const ParameterLayout layout(ModelConfig::qwen3_0_6b(28));
  const std::vector<MuonGroup> groups = muon_groups(layout);
  ASSERT_EQ(groups.size(), 3u);
  // k, v [1024, 1024]; q [2048, 1024] (tall) with o [1024, 2048]; gate, up [3072, 1024] (tall) with down.
  EXPECT_EQ(groups[0].m, 1024);
  EXPECT_EQ(groups[0].n, 1024);
  EXPECT_EQ(groups[0].matrices.size(), 56u);
  EXPECT_EQ(groups[1].n, 2048);
  EXPECT_EQ(groups[1].matrices.size(), 56u);
  EXPECT_EQ(groups[2].n, 3072);
  EXPECT_EQ(groups[2].matrices.size(), 84u);
  const ParameterInfo* q = layout.find("model.layers.3.self_attn.q_proj.weight");
  const ParameterInfo* down = layout.find("model.layers.3.mlp.down_proj.weight");
  for (const MuonMatrix& matrix : groups[1].matrices)
    if (matrix.offset == q->offset) EXPECT_TRUE(matrix.transposed);
  for (const MuonMatrix& matrix : groups[2].matrices)
    if (matrix.offset == down->offset) EXPECT_FALSE(matrix.transposed);

  const ParameterLayout untied(testing::tiny_config(true, true, /*tied=*/false));
  for (const ParameterInfo& info : untied.tensors()) {
    const bool matrix = info.name.find("_proj.weight") != std::string::npos;
    EXPECT_EQ(takes_muon(info), matrix) << info.name;  // not embeddings, LM head, norms, biases
  }
}

TEST(Muon, NewtonSchulzLeavesSingularValuesBetweenHalfAndOneAndAHalf) {
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> scratch;
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{16, 48}, {24, 64}, {32, 96}, {8, 40}}) {
    std::vector<float> x(static_cast<size_t>(m * n));
    for (float& value : x) value = normal(rng) * 1e-3f;
    newton_schulz_cpu(x.data(), m, n, scratch);
    for (const double sigma : testing::singular_values(x.data(), m, n)) {
      EXPECT_GE(sigma, 0.5) << m << "x" << n << " seed " << seed;
      EXPECT_LE(sigma, 1.5) << m << "x" << n << " seed " << seed;
    }
  }
}

TEST(Muon, MatchesThePyTorchReference) {
  const std::filesystem::path path = testing::source_dir() / "tests/fixtures/muon/muon_steps.safetensors";
  // Not a skip: the fixture is part of the test suite, made once on the GPU machine.
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing: run `python3 tools/fixtures/make_muon_fixture.py tests/fixtures/muon` (torch 2.11) and commit it";
  const SafetensorsFile file(path);
  const auto number = [&](const char* key) { return std::stod(file.metadata().at(key)); };
  const MuonSettings settings{number("lr"), number("momentum"), number("weight_decay")};
  const int steps = std::stoi(file.metadata().at("steps")), cases = std::stoi(file.metadata().at("cases"));
  ASSERT_GT(cases, 0);
  auto read = [&](const std::string& name) {
    const SafetensorsEntry& entry = file.entry(name);
    std::vector<float> values(entry.bytes / 4);
    std::memcpy(values.data(), file.bytes(name).data(), entry.bytes);
    return values;
  };
  std::vector<float> scratch;
  for (int k = 0; k < cases; ++k) {
    const std::string prefix = "case" + std::to_string(k) + ".";
    const std::vector<int64_t> shape = file.entry(prefix + "param").shape;
    const int64_t rows = shape[0], cols = shape[1];
    std::vector<float> param = read(prefix + "param"), momentum = read(prefix + "momentum");
    const MuonStepScalars scalars = muon_scalars(settings, std::min(rows, cols), std::max(rows, cols));
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> grad = read(prefix + "grad." + std::to_string(s));
      muon_step_cpu(param.data(), grad.data(), momentum.data(), rows, cols, scalars, nullptr, scratch);
    }
    const std::vector<float> want_param = read(prefix + "param_after"), want_momentum = read(prefix + "momentum_after");
    // FP32 against float64: the momentum to FP32 rounding of its ~1e-3 terms (1e-9), the
    // weights to 1e-5 of the step size.
    const double step_size = scalars.update_scale;
    for (size_t i = 0; i < param.size(); ++i) {
      ASSERT_NEAR(momentum[i], want_momentum[i], 1e-6 * std::fabs(want_momentum[i]) + 1e-9) << prefix << i;
      ASSERT_NEAR(param[i], want_param[i], 1e-5 * step_size + 1e-6 * std::fabs(want_param[i])) << prefix << i;
    }
  }
}

// One GRPO step with Muon equals AdamW's on the tensors Muon leaves to AdamW, and
// muon_step_cpu on the step's (clipped) gradient for the matrices.
TEST(Muon, TheTrainerStepsMatricesWithMuonAndTheRestWithAdamW) {
  const ModelConfig config = testing::trainer_config();
  const ParameterLayout layout(config);
  const std::vector<float> weights = testing::trainer_weights(layout, 5);
  const std::vector<TrainSequence> batch = testing::random_batch(config, 6, 7);
  const ActivationCapacity capacity{testing::batch_tokens(batch), 6};
  testing::CpuTrainer adamw(config, capacity, weights), muon(config, capacity, weights);
  const PolicyLossSettings loss = testing::grpo_loss(LossAggregation::TokenMean);
  const double lr = 1e-2;
  PolicyTrainerSettings settings = testing::trainer_settings(0);
  adamw.trainer.grpo_step(batch, loss, lr, 1, settings);
  settings.optimizer.kind = OptimizerKind::Muon;
  muon.trainer.grpo_step(batch, loss, lr, 1, settings);

  std::vector<float> expected = weights, momentum(weights.size(), 0.0f), scratch;
  const MuonSettings muon_settings{lr, settings.optimizer.momentum, settings.optimizer.adamw.weight_decay};
  int matrices = 0;
  for (const ParameterInfo& info : layout.tensors()) {
    const size_t at = static_cast<size_t>(info.offset), n = static_cast<size_t>(info.numel());
    if (takes_muon(info)) {
      ++matrices;
      const int64_t rows = info.shape[0], cols = info.shape[1];
      muon_step_cpu(expected.data() + at, muon.grads.data() + at, momentum.data() + at, rows, cols,
                    muon_scalars(muon_settings, std::min(rows, cols), std::max(rows, cols)), nullptr, scratch);
      size_t unlike_adamw = 0;
      for (size_t i = at; i < at + n; ++i) {
        ASSERT_EQ(muon.master[i], expected[i]) << info.name;
        ASSERT_EQ(muon.exp_avg[i], momentum[i]) << info.name;
        unlike_adamw += muon.master[i] != adamw.master[i];
      }
      EXPECT_GT(unlike_adamw, n / 2) << info.name;
    } else {
      for (size_t i = at; i < at + n; ++i) ASSERT_EQ(muon.master[i], adamw.master[i]) << info.name;
    }
  }
  EXPECT_EQ(matrices, 7 * config.layers);
}

}  // namespace
}  // namespace tandem
