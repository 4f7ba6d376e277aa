// The Qwen3 chat form of a one-turn prompt (what its tokenizer_config.json template makes
// for a system and a user message with add_generation_prompt):
//   <|im_start|>system\n{system}<|im_end|>\n          (only when a system text is given)
//   <|im_start|>user\n{prompt}<|im_end|>\n
//   <|im_start|>assistant\n
//   <think>\n\n</think>\n\n                           (only with thinking disabled)
// The model continues after the last line and ends its turn with <|im_end|>, the eos of
// that tokenizer's config.
#pragma once
#include <string>
#include <string_view>

#include "tasks/tokenizer.h"

namespace tandem {

struct ChatOptions {
  std::string system;          // empty: no system turn
  bool enable_thinking = true;  // false: the empty think block that turns thinking off
};

std::string qwen3_chat_prompt(std::string_view prompt, const ChatOptions& options);

// Whether the tokenizer has the <|im_start|> and <|im_end|> tokens the template is made of.
bool has_chat_tokens(const Tokenizer& tokenizer);

// What the model is fed for a prompt: the chat form for a tokenizer with chat tokens (a
// pretrained model's), the text unchanged otherwise (the character tokenizer).
std::string model_input_text(const Tokenizer& tokenizer, std::string_view prompt, const ChatOptions& options);

}  // namespace tandem
