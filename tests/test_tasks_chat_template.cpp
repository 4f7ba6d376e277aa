// The Qwen3 chat form of a prompt, and its tokens with the real Qwen3 tokenizer.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support.h"
#include "tasks/char_tokenizer.h"
#include "tasks/chat_template.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(ChatTemplate, Qwen3FormOfOneTurn) {
  EXPECT_EQ(qwen3_chat_prompt("12+34=?", {}),
            "<|im_start|>user\n12+34=?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(qwen3_chat_prompt("hi", {.system = "Be brief.", .enable_thinking = false}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, OnlyTokenizersWithChatTokensGetIt) {
  const CharTokenizer plain("0123456789+=");
  EXPECT_FALSE(has_chat_tokens(plain));
  EXPECT_EQ(model_input_text(plain, "12+34=", {}), "12+34=");
  const CharTokenizer chat("abc", {"<|im_start|>", "<|im_end|>"});
  EXPECT_TRUE(has_chat_tokens(chat));
  EXPECT_EQ(model_input_text(chat, "abc", {}), qwen3_chat_prompt("abc", {}));
}

TEST(ChatTemplate, Qwen3TokenizerReadsTheMarkersAsSpecialTokens) {
  const char* override_folder = std::getenv("TANDEM_QWEN3_TOKENIZER");
  const fs::path folder =
      override_folder ? fs::path(override_folder) : testing::source_dir().parent_path() / "shared/data/qwen3-tokenizer";
  if (!fs::is_regular_file(folder / "tokenizer.json")) GTEST_SKIP() << "no Qwen3 tokenizer in " << folder;
  const auto tokenizer = load_tokenizer(folder);
  ASSERT_TRUE(has_chat_tokens(*tokenizer));
  const std::string text = model_input_text(*tokenizer, "hi", {});
  // <|im_start|> 151644, "user" 872, "\n" 198, "hi" 6023, <|im_end|> 151645, "assistant" 77091.
  EXPECT_EQ(tokenizer->encode(text),
            (std::vector<int32_t>{151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198}));
  EXPECT_EQ(tokenizer->special_ids().eos, 151645);  // the model ends its turn with <|im_end|>
}

}  // namespace
}  // namespace tandem
