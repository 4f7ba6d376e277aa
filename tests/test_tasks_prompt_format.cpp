// What the policy is fed and where it stops: the character tokenizer of a model from
// scratch, and a pretrained folder's tokenizer with the Qwen3 chat template.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support.h"
#include "tasks/prompt_format.h"
#include "tiny_hf_folder.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;
using testing::kTinyEndOfText;
using testing::kTinyImEnd;
using testing::kTinyImStart;

std::string error_of(const auto& make) {
  try {
    make();
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(TasksPromptFormat, CharacterTokenizerPrefixesBosAndStopsAtEos) {
  const PromptFormat format = PromptFormat::for_alphabet("0123456789+=");
  const Tokenizer& tokenizer = format.tokenizer();
  const int32_t bos = tokenizer.id_of("<bos>"), eos = tokenizer.id_of("<eos>");
  EXPECT_FALSE(format.uses_chat_template());
  EXPECT_EQ(format.input_text("12+3="), "12+3=");
  Ids expected = {bos};
  for (const int32_t id : tokenizer.encode("12+3=")) expected.push_back(id);
  EXPECT_EQ(format.input_ids("12+3="), expected);
  EXPECT_EQ(format.stop_ids(), Ids{eos});
  Ids answer = tokenizer.encode("15");
  answer.push_back(eos);
  EXPECT_EQ(format.completion_ids("15"), answer);
  EXPECT_EQ(format.completion_text(answer), "15");
  // A model with a larger vocabulary than the task's may sample an id no character has.
  EXPECT_EQ(format.completion_text(Ids{tokenizer.id_of("1"), tokenizer.vocab_size()}), "<unknown token>");
}

TEST(TasksPromptFormat, PretrainedFolderUsesItsTokenizerTheChatTemplateAndItsEndIds) {
  const testing::TempDir dir;
  testing::write_tiny_hf_tokenizer(dir.path());
  const PromptFormat format = PromptFormat::from_hf_folder(dir.path(), {.enable_thinking = false});
  ASSERT_TRUE(format.uses_chat_template());
  const std::string text = format.input_text("1+2?");
  EXPECT_EQ(text, "<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const Ids ids = format.input_ids(text);
  ASSERT_GT(ids.size(), 4u);
  EXPECT_EQ(ids[0], kTinyImStart);  // no BOS: the tokenizer names none
  EXPECT_EQ(ids[1], 'u');
  // <|im_end|> (the template's turn end and the config's eos), then generation_config's other id.
  EXPECT_EQ(format.stop_ids(), (Ids{kTinyImEnd, kTinyEndOfText}));
  EXPECT_EQ(format.completion_ids("42"), (Ids{'4', '2', kTinyImEnd}));
  EXPECT_EQ(format.completion_text(Ids{'4', '2', kTinyEndOfText}), "42");
  EXPECT_EQ(format.completion_text(Ids{'4', 300}), "<unknown token>");
}

TEST(TasksPromptFormat, ThinkingLeavesTheAssistantTurnOpen) {
  const testing::TempDir dir;
  testing::write_tiny_hf_tokenizer(dir.path());
  const PromptFormat format = PromptFormat::from_hf_folder(dir.path(), {.enable_thinking = true});
  EXPECT_EQ(format.input_text("hi"), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(TasksPromptFormat, MissingFilesAndEndIdsAreNamed) {
  const testing::TempDir dir;
  EXPECT_NE(error_of([&] { PromptFormat::from_hf_folder(dir.path(), {}); }).find((dir / "tokenizer.json").string()),
            std::string::npos);
  // A tokenizer without chat tokens, eos or generation config: nothing would end a completion.
  testing::write_tiny_hf_tokenizer(dir.path());
  auto json = nlohmann::json::parse(testing::read_text(dir / "tokenizer.json"));
  json["added_tokens"] = nlohmann::json::array();
  testing::write_text(dir / "tokenizer.json", json.dump());
  fs::remove(dir / "tokenizer_config.json");
  fs::remove(dir / "generation_config.json");
  const std::string message = error_of([&] { PromptFormat::from_hf_folder(dir.path(), {}); });
  EXPECT_NE(message.find("no end-of-sequence token"), std::string::npos) << message;
  testing::write_text(dir / "generation_config.json", R"({"eos_token_id": "x"})");
  EXPECT_NE(error_of([&] { PromptFormat::from_hf_folder(dir.path(), {}); }).find("generation_config.json"),
            std::string::npos);
}

TEST(TasksPromptFormat, Qwen3TokenizerEndsTurnsAtImEnd) {
  const char* override_folder = std::getenv("TANDEM_QWEN3_TOKENIZER");
  const fs::path folder =
      override_folder ? fs::path(override_folder) : testing::source_dir().parent_path() / "shared/data/qwen3-tokenizer";
  if (!fs::is_regular_file(folder / "tokenizer.json")) GTEST_SKIP() << "no Qwen3 tokenizer in " << folder;
  const PromptFormat format = PromptFormat::from_hf_folder(folder, {.enable_thinking = false});
  EXPECT_EQ(format.end_id(), 151645);
  EXPECT_EQ(format.input_ids(format.input_text("hi")).front(), 151644);
}

}  // namespace
}  // namespace tandem
