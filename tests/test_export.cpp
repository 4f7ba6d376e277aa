// `tandem export` of a short run that started from a Hugging Face folder: the exported
// folder imports back to the checkpoint's logits (bit for bit in F32, within BF16's
// rounding in BF16), carries the origin's tokenizer files, and `tandem generate` gives the
// same completion from the folder as from the checkpoint itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "export/checkpoint_policy.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/hf_import.h"
#include "support.h"
#include "test_model_support.h"
#include "tiny_hf_folder.h"

namespace tandem {
namespace {

using testing::run_command;
using testing::TempDir;

std::string tandem_cmd(const std::string& args) { return testing::tandem_binary() + " " + args; }

class Export : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tandem-export");
    std::filesystem::create_directories(*dir_ / "model");
    testing::write_tiny_hf_model(*dir_ / "model");
    testing::write_text(*dir_ / "prompts.jsonl", "{\"prompt\": \"What is 2+3?\", \"answer\": 5}\n"
                                                 "{\"prompt\": \"What is 7-4?\", \"answer\": 3}\n");
    const auto result = run_command(
        "OMP_NUM_THREADS=1 " +
        tandem_cmd("--world.device=cpu --run.output-dir=" + dir_->path().string() + " --run.name=hf --model.path=" +
                   (*dir_ / "model").string() + " --task.name=jsonl --task.path=" + (*dir_ / "prompts.jsonl").string() +
                   " --task.reward=last-number --run.steps=2 --sft.steps=1 --run.checkpoint-every=2"
                   " --task.prompts-per-step=2 --grpo.group-size=2 --grpo.max-new-tokens=4 --grpo.lr=1e-2 --sft.lr=1e-2"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::filesystem::path checkpoint() { return *dir_ / "hf" / checkpoint_file_name(2); }
  static TempDir* dir_;
};
TempDir* Export::dir_ = nullptr;

const std::vector<int32_t> kIds = {257, 72, 105, 33, 258, 10, 50, 43, 51, 61};

// Logits of a token sequence under `weights` (an FP32 slab of the config's layout).
std::vector<float> logits(const ModelConfig& config, const std::vector<float>& weights,
                          const std::vector<int32_t>& ids = kIds) {
  testing::TinyModel model(config, {static_cast<int64_t>(ids.size()), 1});
  std::copy(weights.begin(), weights.end(), model.weights.begin());
  const std::vector<int32_t> cu = {0, static_cast<int32_t>(ids.size())};
  const Tensor out = model.transformer.forward(model.params, model.acts, ids, cu);
  return std::vector<float>(out.ptr<float>(), out.ptr<float>() + out.numel());
}

std::vector<float> imported(const std::filesystem::path& folder, const ModelConfig& config) {
  const ParameterLayout layout(config);
  std::vector<float> weights(static_cast<size_t>(layout.slab_elements()), 0.0f);
  load_hf_weights(folder, ParameterSet::bind(layout, weights.data(), DType::F32));
  return weights;
}

TEST_F(Export, F32RoundTripGivesTheCheckpointsLogitsAndTokenizerFiles) {
  const std::filesystem::path out = *dir_ / "export-f32";
  const auto result = run_command(tandem_cmd("export " + checkpoint().string() + " --hf " + out.string() + " --dtype f32"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(std::filesystem::is_regular_file(out / file)) << file;
  EXPECT_EQ(testing::read_text(out / "tokenizer.json"), testing::read_text(*dir_ / "model" / "tokenizer.json"));

  const CheckpointPolicy policy = load_checkpoint_policy(checkpoint());
  const ModelConfig config = load_hf_config(out);
  EXPECT_EQ(config.to_hf_json("F32"), policy.config.to_hf_json("F32"));
  const std::vector<float> trained = logits(policy.config, policy.weights);
  EXPECT_EQ(logits(config, imported(out, config)), trained);
  EXPECT_NE(logits(config, imported(*dir_ / "model", config)), trained) << "the export holds the trained weights";
}

TEST_F(Export, Bf16RoundTripIsWithinRounding) {
  const std::filesystem::path out = *dir_ / "export-bf16";
  ASSERT_EQ(run_command(tandem_cmd("export " + checkpoint().string() + " --hf " + out.string())).exit_code, 0);
  const CheckpointPolicy policy = load_checkpoint_policy(checkpoint());
  const std::vector<float> want = logits(policy.config, policy.weights);
  const std::vector<float> got = logits(policy.config, imported(out, policy.config));
  float scale = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::fabs(want[i])), worst = std::max(worst, std::fabs(got[i] - want[i]));
  // BF16 keeps 8 bits of mantissa: weights within 2^-9 relative, logits within a few times that.
  EXPECT_LT(worst, 0.03f * scale + 1e-3f) << "largest logit " << scale;
  EXPECT_GT(worst, 0.0f) << "the weights were rounded to BF16";
}

TEST_F(Export, GenerateReadsTheExportAndTheCheckpointAlike) {
  const std::filesystem::path out = *dir_ / "export-generate";
  ASSERT_EQ(run_command(tandem_cmd("export " + checkpoint().string() + " --hf " + out.string() + " --dtype f32")).exit_code, 0);
  // stdout only: the summary on stderr has the time taken.
  const std::string flags = " --prompt 'What is 2+3?' --chat --temperature 0 --max-new 6 --ids 2>/dev/null)";
  const auto from_folder = run_command("(" + tandem_cmd("generate --model " + out.string() + flags));
  const auto from_checkpoint = run_command("(" + tandem_cmd("generate --model " + checkpoint().string() + flags));
  ASSERT_EQ(from_folder.exit_code, 0) << from_folder.output;
  ASSERT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.output;
  EXPECT_EQ(from_folder.output, from_checkpoint.output);
  EXPECT_FALSE(from_folder.output.empty());

  // --logits: the prompt's logits, which tools/check_export_transformers.py compares.
  const std::filesystem::path file = *dir_ / "logits.safetensors";
  ASSERT_EQ(run_command(tandem_cmd("generate --model " + out.string() + " --prompt 'What is 2+3?' --max-new 1 --logits " +
                                   file.string())).exit_code, 0);
  const SafetensorsFile stored(file);
  const auto id_bytes = stored.bytes("input_ids");
  std::vector<int32_t> ids(id_bytes.size() / sizeof(int32_t));
  std::memcpy(ids.data(), id_bytes.data(), id_bytes.size());
  EXPECT_EQ(ids.size(), std::string("What is 2+3?").size()) << "one token per byte, no BOS";
  const auto logit_bytes = stored.bytes("logits");
  std::vector<float> written(logit_bytes.size() / sizeof(float));
  std::memcpy(written.data(), logit_bytes.data(), logit_bytes.size());
  const CheckpointPolicy policy = load_checkpoint_policy(checkpoint());
  EXPECT_EQ(written, logits(policy.config, policy.weights, ids));
}

TEST(ExportCommand, BadInputExitsTwo) {
  TempDir dir("tandem-export");
  EXPECT_EQ(run_command(tandem_cmd("export " + (dir / "missing.h5").string() + " --hf " + (dir / "out").string())).exit_code, 2);
  EXPECT_EQ(run_command(tandem_cmd("export x.h5 --hf out --dtype f16")).exit_code, 2);
  EXPECT_EQ(run_command(tandem_cmd("export x.h5")).exit_code, 2) << "--hf is required";
}

}  // namespace
}  // namespace tandem
