// `tandem generate` on a model folder made here: a tiny random Qwen3-style model with a
// byte-level tokenizer of 256 bytes plus three special tokens. The command's tokens must
// be those of the engine run directly on the same prompt (greedy at temperature 0, with
// the tokenizer's EOS as a stop), the chat template must wrap the prompt, and a seed must
// reproduce a sampled completion.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "model/hf_import.h"
#include "rollout/generate_command.h"
#include "support.h"
#include "tasks/byte_level.h"
#include "test_rollout_support.h"

namespace tandem {
namespace {

constexpr int32_t kImStart = 256, kImEnd = 257, kEndOfText = 258;

ModelConfig command_model_config() {
  ModelConfig config = testing::tiny_config(true, false, true);
  config.vocab = 259;
  return config;
}

void write_model_folder(const std::filesystem::path& folder) {
  testing::RolloutRig rig(command_model_config(), 21);
  export_hf(folder, rig.model.params, DType::F32);
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::byte_symbols()[b]] = b;
  nlohmann::json added = nlohmann::json::array();
  for (const auto& [id, text] :
       {std::pair{kImStart, "<|im_start|>"}, {kImEnd, "<|im_end|>"}, {kEndOfText, "<|endoftext|>"}})
    added.push_back({{"id", id},
                     {"content", text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", nlohmann::json::array()}}},
  };
  testing::write_text(folder / "tokenizer.json", tokenizer.dump());
  testing::write_text(folder / "tokenizer_config.json", R"({"eos_token": "<|endoftext|>"})");
}

struct CommandOutput {
  int status = -1;
  std::vector<std::string> lines;
  std::string errors;
};

CommandOutput run_generate(std::vector<std::string> args) {
  args.insert(args.begin(), "generate");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  std::ostringstream out, err;
  CommandOutput result;
  result.status = generate_command(static_cast<int>(argv.size()), argv.data(), out, err);
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) result.lines.push_back(line);
  result.errors = err.str();
  return result;
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::istringstream words(line);
  std::vector<int32_t> ids;
  for (int32_t id; words >> id;) ids.push_back(id);
  return ids;
}

class GenerateCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("tandem-generate");
    write_model_folder(dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string folder() { return dir_->path().string(); }

  // The engine run directly on the folder's weights.
  static Completion direct(const std::string& prompt_text, std::vector<int32_t> stops, SamplingParams sampling) {
    const auto tokenizer = load_tokenizer(dir_->path());
    testing::RolloutRig rig(load_hf_config(dir_->path()));
    load_hf_weights(dir_->path(), rig.model.params);
    auto engine = rig.make_engine();
    sampling.stop_token_ids = std::move(stops);
    return engine->generate({{0, tokenizer->encode(prompt_text), sampling}}).front();
  }

  static testing::TempDir* dir_;
};
testing::TempDir* GenerateCommand::dir_ = nullptr;

TEST_F(GenerateCommand, GreedyPrintsTheEnginesTokensAndText) {
  const CommandOutput out =
      run_generate({"--model", folder(), "--prompt", "Hello, world", "--temperature", "0", "--max-new", "10", "--ids"});
  ASSERT_EQ(out.status, 0) << out.errors;
  ASSERT_GE(out.lines.size(), 2u) << "a text line (random bytes may hold newlines too) and the ids line";
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 10;
  const Completion expected = direct("Hello, world", {kEndOfText}, greedy);
  EXPECT_EQ(parse_ids(out.lines.back()), expected.tokens);
  EXPECT_NE(out.errors.find("finish: "), std::string::npos) << out.errors;
}

TEST_F(GenerateCommand, ChatWrapsThePromptInTheQwen3Template) {
  const CommandOutput out =
      run_generate({"--model", folder(), "--prompt", "Hi", "--temperature", "0", "--max-new", "8", "--ids", "--chat"});
  ASSERT_EQ(out.status, 0) << out.errors;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 8;
  const Completion expected =
      direct("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", {kImEnd, kEndOfText}, greedy);
  EXPECT_EQ(parse_ids(out.lines.back()), expected.tokens);
  EXPECT_NE(out.errors.find("21 prompt tokens"), std::string::npos) << out.errors;  // 3 special + 18 bytes
}

TEST_F(GenerateCommand, SampledCompletionsFollowTheSeed) {
  auto ids = [&](const std::string& seed) {
    const CommandOutput out = run_generate({"--model", folder(), "--prompt", "abc", "--seed", seed, "--top-p", "0.95",
                                            "--top-k", "50", "--max-new", "12", "--ids"});
    EXPECT_EQ(out.status, 0) << out.errors;
    return out.lines.empty() ? std::vector<int32_t>{} : parse_ids(out.lines.back());
  };
  EXPECT_EQ(ids("3"), ids("3"));
  EXPECT_NE(ids("3"), ids("4"));
  SamplingParams sampling;
  sampling.top_p = 0.95f;
  sampling.top_k = 50;
  sampling.max_new_tokens = 12;
  sampling.seed = 3;
  EXPECT_EQ(ids("3"), direct("abc", {kEndOfText}, sampling).tokens);
}

TEST_F(GenerateCommand, ReportsBadOptionsAndFailures) {
  CommandOutput out = run_generate({"--prompt", "x"});
  EXPECT_EQ(out.status, 2);
  EXPECT_NE(out.errors.find("--model"), std::string::npos) << out.errors;
  out = run_generate({"--model", folder() + "/missing", "--prompt", "x"});
  EXPECT_EQ(out.status, 1);
  EXPECT_NE(out.errors.find("missing"), std::string::npos) << out.errors;
  out = run_generate({"--model", folder(), "--prompt", "x", "--max-new", "0"});
  EXPECT_EQ(out.status, 1);
  EXPECT_NE(out.errors.find("max_new_tokens"), std::string::npos) << out.errors;
  out = run_generate({"--help"});
  EXPECT_EQ(out.status, 0);
  EXPECT_FALSE(out.lines.empty());
}

}  // namespace
}  // namespace tandem
