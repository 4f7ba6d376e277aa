#include "tasks/chat_template.h"

namespace tandem {

std::string qwen3_chat_prompt(std::string_view prompt, const ChatOptions& options) {
  std::string text;
  if (!options.system.empty()) text += "<|im_start|>system\n" + options.system + "<|im_end|>\n";
  text += "<|im_start|>user\n";
  text += prompt;
  text += "<|im_end|>\n<|im_start|>assistant\n";
  if (!options.enable_thinking) text += "<think>\n\n</think>\n\n";
  return text;
}

bool has_chat_tokens(const Tokenizer& tokenizer) {
  return tokenizer.find_id("<|im_start|>") && tokenizer.find_id("<|im_end|>");
}

std::string model_input_text(const Tokenizer& tokenizer, std::string_view prompt, const ChatOptions& options) {
  return has_chat_tokens(tokenizer) ? qwen3_chat_prompt(prompt, options) : std::string(prompt);
}

}  // namespace tandem
