// tandem's CPU backend against Hugging Face transformers (eager attention, FP32) on small
// random-weight models written by tools/fixtures/make_model_fixtures.py:
//   tests/fixtures/model/<name>/config.json, model.safetensors   the model (save_pretrained)
//   tests/fixtures/model/<name>/reference.safetensors            input_ids.<s> (I64 [len]),
//       logits.<s> (F32 [len, vocab]) per sequence s, run one sequence at a time by torch;
//       for some models also loss (F32 [1]) and grad.<parameter name>, the gradient of the
//       next-token cross-entropy summed over all sequences.
// tandem runs the sequences as ONE packed batch, so this also checks packing against
// independent runs. Tolerances: logits 1e-4 absolute (FP32 vs FP32, different summation
// orders); loss 1e-5 relative; gradients 1e-4 + 1e-3·|reference| per element.
// Each test skips while its fixture folder is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/safetensors.h"
#include "model/cross_entropy.h"
#include "model/hf_import.h"
#include "support.h"
#include "test_model_support.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

template <class T>
std::vector<T> read_values(const SafetensorsFile& file, const std::string& name, DType dtype) {
  const SafetensorsEntry& entry = file.entry(name);
  if (entry.dtype != dtype) throw std::runtime_error(name + " is " + dtype_name(entry.dtype));
  std::vector<T> values(entry.bytes / sizeof(T));
  std::memcpy(values.data(), file.bytes(name).data(), entry.bytes);  // offsets may be unaligned
  return values;
}

struct Fixture {
  std::filesystem::path folder;
  std::unique_ptr<SafetensorsFile> reference;
  std::vector<int32_t> ids, cu_seqlens = {0};
};

Fixture open_fixture(const std::string& name) {
  Fixture fixture;
  fixture.folder = source_dir() / "tests" / "fixtures" / "model" / name;
  if (!std::filesystem::exists(fixture.folder)) return fixture;
  fixture.reference = std::make_unique<SafetensorsFile>(fixture.folder / "reference.safetensors");
  for (int s = 0; fixture.reference->find("input_ids." + std::to_string(s)); ++s) {
    for (int64_t id : read_values<int64_t>(*fixture.reference, "input_ids." + std::to_string(s), DType::I64))
      fixture.ids.push_back(static_cast<int32_t>(id));
    fixture.cu_seqlens.push_back(static_cast<int32_t>(fixture.ids.size()));
  }
  return fixture;
}

#define SKIP_WITHOUT(fixture)                                                                        \
  if (!fixture.reference)                                                                            \
  GTEST_SKIP() << fixture.folder << " is absent (python3 tools/fixtures/make_model_fixtures.py " \
                  "tests/fixtures/model, on a machine with torch and transformers)"

class ModelHfFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelHfFixture, PackedLogitsMatchTransformers) {
  const Fixture fixture = open_fixture(GetParam());
  SKIP_WITHOUT(fixture);
  ASSERT_GE(fixture.cu_seqlens.size(), 3u) << "a fixture should hold at least two sequences";
  const ModelConfig config = load_hf_config(fixture.folder);
  TinyModel model(config, {static_cast<int64_t>(fixture.ids.size()), static_cast<int64_t>(fixture.cu_seqlens.size())});
  load_hf_weights(fixture.folder, model.params);

  const Tensor logits = model.transformer.forward(model.params, model.acts, fixture.ids, fixture.cu_seqlens);
  const int64_t V = config.vocab;
  for (size_t s = 0; s + 1 < fixture.cu_seqlens.size(); ++s) {
    const std::vector<float> expected = read_values<float>(*fixture.reference, "logits." + std::to_string(s), DType::F32);
    const int64_t begin = fixture.cu_seqlens[s], length = fixture.cu_seqlens[s + 1] - begin;
    ASSERT_EQ(static_cast<int64_t>(expected.size()), length * V);
    float worst = 0, largest = 0;
    for (int64_t i = 0; i < length * V; ++i) {
      worst = std::max(worst, std::fabs(logits.ptr<float>()[begin * V + i] - expected[i]));
      largest = std::max(largest, std::fabs(expected[i]));
    }
    EXPECT_LE(worst, 1e-4f) << "sequence " << s << " (largest reference logit " << largest << ")";
    EXPECT_GT(largest, 0.5f) << "reference logits this small would make the comparison meaningless";
  }
}

TEST_P(ModelHfFixture, GradientsMatchTransformers) {
  const Fixture fixture = open_fixture(GetParam());
  SKIP_WITHOUT(fixture);
  if (!fixture.reference->find("loss")) GTEST_SKIP() << "this fixture has no reference gradients";
  const ModelConfig config = load_hf_config(fixture.folder);
  TinyModel model(config, {static_cast<int64_t>(fixture.ids.size()), static_cast<int64_t>(fixture.cu_seqlens.size())});
  load_hf_weights(fixture.folder, model.params);

  const Tensor logits = model.transformer.forward(model.params, model.acts, fixture.ids, fixture.cu_seqlens);
  const double loss = cross_entropy(logits, next_token_targets(fixture.ids, fixture.cu_seqlens), logits);
  const float expected_loss = read_values<float>(*fixture.reference, "loss", DType::F32).at(0);
  EXPECT_NEAR(loss, expected_loss, 1e-5 * std::fabs(expected_loss));
  model.zero_grads();
  model.transformer.backward(model.params, model.grads, model.acts, logits);

  for (size_t i = 0; i < model.layout.tensors().size(); ++i) {
    const ParameterInfo& info = model.layout.tensors()[i];
    const std::vector<float> expected = read_values<float>(*fixture.reference, "grad." + info.name, DType::F32);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), info.numel()) << info.name;
    const float* grad = model.grads.all[i].ptr<float>();
    int mismatches = 0;
    for (int64_t e = 0; e < info.numel() && mismatches < 5; ++e)
      if (std::fabs(grad[e] - expected[e]) > 1e-4f + 1e-3f * std::fabs(expected[e])) {
        ++mismatches;
        ADD_FAILURE() << info.name << " entry " << e << ": tandem " << grad[e] << ", transformers " << expected[e];
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelHfFixture, ::testing::Values("qwen3", "llama", "qwen2"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
