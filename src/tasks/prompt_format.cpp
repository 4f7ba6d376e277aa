#include "tasks/prompt_format.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tasks/char_tokenizer.h"

namespace tandem {
namespace {

// generation_config.json's eos_token_id: a number, a list of numbers, or null/absent.
std::vector<int32_t> generation_config_eos_ids(const std::filesystem::path& folder) {
  const std::filesystem::path file = folder / "generation_config.json";
  if (!std::filesystem::is_regular_file(file)) return {};
  std::ifstream in(file);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(file.string() + ": not valid JSON (" + error.what() + ")");
  }
  const auto eos = config.find("eos_token_id");
  if (eos == config.end() || eos->is_null()) return {};
  const auto id_of = [&](const nlohmann::json& value) {
    if (!value.is_number_integer()) throw std::runtime_error(file.string() + ": eos_token_id must be an id or a list of ids");
    return value.get<int32_t>();
  };
  if (!eos->is_array()) return {id_of(*eos)};
  std::vector<int32_t> ids;
  for (const nlohmann::json& value : *eos) ids.push_back(id_of(value));
  return ids;
}

}  // namespace

PromptFormat::PromptFormat(std::unique_ptr<Tokenizer> tokenizer, const ChatOptions& chat, std::vector<int32_t> stop_ids)
    : tokenizer_(std::move(tokenizer)), chat_options_(chat), chat_(has_chat_tokens(*tokenizer_)) {
  for (const int32_t id : stop_ids)
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) stop_ids_.push_back(id);
}

PromptFormat PromptFormat::for_alphabet(std::string_view alphabet) {
  auto tokenizer = std::make_unique<CharTokenizer>(alphabet);
  const int32_t eos = *tokenizer->special_ids().eos;
  return PromptFormat(std::move(tokenizer), {}, {eos});
}

PromptFormat PromptFormat::from_hf_folder(const std::filesystem::path& folder, const ChatOptions& chat) {
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(folder);
  std::vector<int32_t> stop_ids;
  if (has_chat_tokens(*tokenizer)) stop_ids.push_back(tokenizer->id_of("<|im_end|>"));
  if (tokenizer->special_ids().eos) stop_ids.push_back(*tokenizer->special_ids().eos);
  for (const int32_t id : generation_config_eos_ids(folder)) stop_ids.push_back(id);
  if (stop_ids.empty())
    throw std::runtime_error((folder / "tokenizer_config.json").string() +
                             ": no end-of-sequence token (no eos_token here, no <|im_end|> in tokenizer.json, no "
                             "eos_token_id in generation_config.json): completions could never stop");
  return PromptFormat(std::move(tokenizer), chat, std::move(stop_ids));
}

std::string PromptFormat::input_text(std::string_view prompt) const {
  return model_input_text(*tokenizer_, prompt, chat_options_);
}

std::vector<int32_t> PromptFormat::input_ids(std::string_view input_text) const {
  std::vector<int32_t> ids;
  if (tokenizer_->special_ids().bos) ids.push_back(*tokenizer_->special_ids().bos);
  const std::vector<int32_t> text = tokenizer_->encode(input_text);
  ids.insert(ids.end(), text.begin(), text.end());
  return ids;
}

std::vector<int32_t> PromptFormat::completion_ids(std::string_view completion) const {
  std::vector<int32_t> ids = tokenizer_->encode(completion);
  ids.push_back(end_id());
  return ids;
}

std::string PromptFormat::completion_text(std::span<const int32_t> ids) const {
  if (!ids.empty() && std::find(stop_ids_.begin(), stop_ids_.end(), ids.back()) != stop_ids_.end())
    ids = ids.first(ids.size() - 1);
  const int32_t limit = tokenizer_->vocab_size();
  if (std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return id < 0 || id >= limit; })) return "<unknown token>";
  try {
    return tokenizer_->decode(ids);
  } catch (const std::out_of_range&) {
    return "<unknown token>";  // an unused id inside the tokenizer's range
  }
}

}  // namespace tandem
