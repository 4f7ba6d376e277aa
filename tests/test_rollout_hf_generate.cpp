// The engine's greedy generation against Hugging Face transformers' `generate` on the
// small random-weight models of tests/fixtures/model (FP32, eager attention, CPU), from
// tests/fixtures/model/<name>/generate.json written by
// tools/fixtures/make_generate_fixture.py. All prompts run as ONE continuously batched
// rollout here, one at a time there. Skips while a fixture file is absent.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/hf_import.h"
#include "support.h"
#include "test_rollout_support.h"

namespace tandem {
namespace {

class RolloutHfGenerate : public ::testing::TestWithParam<const char*> {};

TEST_P(RolloutHfGenerate, GreedyTokensMatchTransformersGenerate) {
  const std::filesystem::path folder = testing::source_dir() / "tests" / "fixtures" / "model" / GetParam();
  const std::filesystem::path fixture_file = folder / "generate.json";
  if (!std::filesystem::exists(fixture_file))
    GTEST_SKIP() << fixture_file << " is absent (python3 tools/fixtures/make_generate_fixture.py "
                 << "tests/fixtures/model, on a machine with torch and transformers)";
  std::ifstream in(fixture_file);
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const int max_new = fixture.at("max_new_tokens").get<int>();

  testing::RolloutRig rig(load_hf_config(folder));
  load_hf_weights(folder, rig.model.params);
  EngineOptions options = testing::small_engine_options();
  options.max_step_tokens = 16;  // longer prompts are prefilled in chunks
  auto engine = rig.make_engine(options);

  std::vector<GenerationRequest> requests;
  for (const nlohmann::json& test_case : fixture.at("cases")) {
    GenerationRequest request;
    request.id = requests.size();
    request.prompt = test_case.at("prompt").get<std::vector<int32_t>>();
    request.sampling.temperature = 0;
    request.sampling.max_new_tokens = max_new;
    requests.push_back(request);
  }
  ASSERT_FALSE(requests.empty());
  const std::vector<Completion> completions = engine->generate(requests);
  for (size_t c = 0; c < requests.size(); ++c) {
    const nlohmann::json& test_case = fixture.at("cases")[c];
    EXPECT_EQ(completions[c].tokens, test_case.at("generated").get<std::vector<int32_t>>())
        << "prompt " << c << " (smallest top-2 logit margin in the reference: " << test_case.at("min_margin") << ")";
  }
}

// Without the generate fixture: on the same models (real head sizes, Llama 3 RoPE scaling,
// q/k/v bias), greedy decoding through the cache picks the argmax of the trainer's full
// forward, which tests/test_model_hf_fixtures.cpp holds to transformers' logits.
TEST_P(RolloutHfGenerate, GreedyWithCacheIsTheArgmaxOfTheFullForward) {
  const std::filesystem::path folder = testing::source_dir() / "tests" / "fixtures" / "model" / GetParam();
  if (!std::filesystem::exists(folder / "config.json")) GTEST_SKIP() << folder << " is absent";
  testing::RolloutRig rig(load_hf_config(folder));
  load_hf_weights(folder, rig.model.params);
  auto engine = rig.make_engine();
  const int V = rig.model.config.vocab;
  GenerationRequest request{0, testing::random_prompt(9, V, 4), {}};
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = 16;
  const Completion completion = engine->generate({request}).front();
  ASSERT_EQ(completion.tokens.size(), 16u);

  std::vector<int32_t> sequence = request.prompt;
  sequence.insert(sequence.end(), completion.tokens.begin(), completion.tokens.end() - 1);
  const std::vector<int32_t> cu = {0, static_cast<int32_t>(sequence.size())};
  const Tensor logits = rig.model.transformer.forward(rig.model.params, rig.model.acts, sequence, cu);
  for (size_t i = 0; i < completion.tokens.size(); ++i) {
    const float* row = logits.ptr<float>() + (request.prompt.size() - 1 + i) * V;  // causal: sees tokens < i only
    EXPECT_EQ(completion.tokens[i], std::max_element(row, row + V) - row) << "step " << i;
    EXPECT_NEAR(completion.logprobs[i], testing::reference_logprob(row, V, completion.tokens[i], 1.0), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RolloutHfGenerate, ::testing::Values("qwen3", "llama", "qwen2"));

}  // namespace
}  // namespace tandem
