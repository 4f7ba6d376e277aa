// How the policy reads and writes a task's text: its tokenizer, what a task prompt becomes
// before it is tokenized, and the ids that end a completion.
//
// A model tandem creates from scratch reads the compact prompts through a character
// tokenizer over the task's alphabet: "<bos>" then the text, and it stops at "<eos>". A
// pretrained model reads through its own tokenizer.json, with the prompt wrapped in the
// Qwen3 chat template when the tokenizer has the template's tokens, and it stops at any
// end id its folder names (tokenizer_config.json's eos_token, <|im_end|> for a chat,
// generation_config.json's eos_token_id).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tasks/chat_template.h"
#include "tasks/tokenizer.h"

namespace tandem {

class PromptFormat {
 public:
  // A character tokenizer over `alphabet`, with "<pad>", "<bos>" and "<eos>".
  static PromptFormat for_alphabet(std::string_view alphabet);
  // The tokenizer of a Hugging Face model folder. Throws std::runtime_error naming the
  // file when tokenizer.json is missing or unreadable, or when no end id is named anywhere.
  static PromptFormat from_hf_folder(const std::filesystem::path& folder, const ChatOptions& chat);

  // The text the model is fed for a task prompt: the chat form, or the prompt unchanged.
  std::string input_text(std::string_view prompt) const;
  // The ids of an input text, BOS first when the tokenizer has one.
  std::vector<int32_t> input_ids(std::string_view input_text) const;
  // A reference completion as ids, ended by end_id() (the supervised warm-up's target).
  std::vector<int32_t> completion_ids(std::string_view completion) const;
  // The text of generated ids without the stop id that ended them. An id the tokenizer
  // cannot decode (the model's vocabulary may be larger) makes the text "<unknown token>",
  // which no task accepts.
  std::string completion_text(std::span<const int32_t> ids) const;

  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  // The id that ends a turn: <|im_end|> for a chat, else the tokenizer's eos.
  int32_t end_id() const { return stop_ids_.front(); }
  bool uses_chat_template() const { return chat_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  PromptFormat(std::unique_ptr<Tokenizer> tokenizer, const ChatOptions& chat, std::vector<int32_t> stop_ids);

  std::unique_ptr<Tokenizer> tokenizer_;
  ChatOptions chat_options_;
  bool chat_ = false;
  std::vector<int32_t> stop_ids_;  // end_id() first, no repeats
};

}  // namespace tandem
