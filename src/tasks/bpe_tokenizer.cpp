#include "tasks/bpe_tokenizer.h"

#include <fstream>
#include <iterator>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tasks/byte_level.h"
#include "tasks/utf8_text.h"

namespace tandem {
namespace {

using nlohmann::json;

// The split ByteLevel applies itself when use_regex is true (GPT-2).
constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file.string() + ": cannot open");
  // Parsing from memory is several times faster than from the stream.
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(file.string() + ": not valid JSON: " + e.what());
  }
}

// Reads the components of one tokenizer.json, naming the file and the component in
// every error.
class ComponentReader {
 public:
  explicit ComponentReader(std::filesystem::path file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& component, const std::string& reason) const {
    throw std::runtime_error(file_.string() + ": " + component + ": " + reason);
  }

  static std::string type_of(const json& component) {
    const auto type = component.find("type");
    return type != component.end() && type->is_string() ? type->get<std::string>() : "";
  }

  bool flag(const json& object, const char* key, bool fallback) const {
    const auto found = object.find(key);
    if (found == object.end() || found->is_null()) return fallback;
    if (!found->is_boolean()) fail(key, "expected true or false");
    return found->get<bool>();
  }

  void require_empty_string(const json& object, const char* key, const std::string& component) const {
    const auto found = object.find(key);
    if (found != object.end() && !found->is_null() && *found != "") {
      fail(component, std::string(key) + " " + found->dump() + " is not supported");
    }
  }

  // True for NFC; false for no normaliser.
  bool normalizer(const json& normalizer) const {
    if (normalizer.is_null()) return false;
    const std::string type = type_of(normalizer);
    if (type == "NFC") return true;
    if (type == "Sequence") {
      bool nfc = false;
      for (const json& step : normalizer.at("normalizers")) nfc = this->normalizer(step) || nfc;
      return nfc;
    }
    fail("normalizer", "type '" + type + "' is not supported (only NFC, or none)");
  }

  struct PreTokenizer {
    std::vector<std::string> split_patterns;
    bool add_prefix_space = false;
    bool use_regex = false;
  };

  PreTokenizer pre_tokenizer(const json& pre_tokenizer) const {
    if (pre_tokenizer.is_null()) {
      fail("pre_tokenizer", "missing; a byte-level BPE needs a ByteLevel pre-tokenizer");
    }
    std::vector<json> steps;
    if (type_of(pre_tokenizer) == "Sequence") {
      for (const json& step : pre_tokenizer.at("pretokenizers")) steps.push_back(step);
    } else {
      steps.push_back(pre_tokenizer);
    }
    PreTokenizer result;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const json& step = steps[i];
      const std::string type = type_of(step);
      const bool last = i + 1 == steps.size();
      if (type == "Split" && !last) {
        const json& pattern = step.at("pattern");
        if (!pattern.contains("Regex")) {
          fail("pre_tokenizer Split", "pattern " + pattern.dump() + " is not supported (only Regex)");
        }
        const std::string behavior = step.value("behavior", "");
        if (behavior != "Isolated") {
          fail("pre_tokenizer Split", "behavior '" + behavior + "' is not supported (only Isolated)");
        }
        if (flag(step, "invert", false)) fail("pre_tokenizer Split", "invert is not supported");
        result.split_patterns.push_back(pattern.at("Regex").get<std::string>());
      } else if (type == "ByteLevel" && last) {
        result.add_prefix_space = flag(step, "add_prefix_space", false);
        result.use_regex = flag(step, "use_regex", true);
      } else {
        fail("pre_tokenizer", "step " + std::to_string(i) + " of type '" + type +
                                  "' is not supported (Split steps followed by one ByteLevel)");
      }
    }
    return result;
  }

  std::unique_ptr<BpeModel> model(const json& model) const {
    const std::string type = type_of(model);
    if (!type.empty() && type != "BPE") fail("model", "type '" + type + "' is not supported (only BPE)");
    const auto dropout = model.find("dropout");
    if (dropout != model.end() && !dropout->is_null() && dropout->get<double>() != 0.0) {
      fail("model", "BPE dropout is not supported");
    }
    if (flag(model, "byte_fallback", false)) fail("model", "byte_fallback is not supported");
    require_empty_string(model, "continuing_subword_prefix", "model");
    require_empty_string(model, "end_of_word_suffix", "model");

    StringMap<int32_t> vocab;
    vocab.reserve(model.at("vocab").size());
    for (const auto& [text, id] : model.at("vocab").items()) vocab.emplace(text, id.get<int32_t>());

    std::vector<std::pair<std::string, std::string>> merges;
    for (const json& merge : model.at("merges")) {
      if (merge.is_array() && merge.size() == 2) {
        merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
        continue;
      }
      const std::string line = merge.is_string() ? merge.get<std::string>() : "";
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        fail("model", "merge " + merge.dump() + " is neither \"left right\" nor [left, right]");
      }
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    }
    return std::make_unique<BpeModel>(std::move(vocab), merges, flag(model, "ignore_merges", false),
                                      file_.string());
  }

  void decoder(const json& decoder) const {
    if (type_of(decoder) != "ByteLevel") {
      fail("decoder", "type '" + type_of(decoder) + "' is not supported (only ByteLevel)");
    }
  }

  std::vector<AddedToken> added_tokens(const json& tokens) const {
    std::vector<AddedToken> result;
    if (tokens.is_null()) return result;
    for (const json& token : tokens) {
      AddedToken added;
      added.id = token.at("id").get<int32_t>();
      added.content = token.at("content").get<std::string>();
      added.single_word = flag(token, "single_word", false);
      added.lstrip = flag(token, "lstrip", false);
      added.rstrip = flag(token, "rstrip", false);
      added.normalized = flag(token, "normalized", true);
      added.special = flag(token, "special", false);
      if (added.id < 0 || added.content.empty()) {
        fail("added_tokens", "entry " + token.dump() + " needs an id >= 0 and non-empty content");
      }
      result.push_back(std::move(added));
    }
    return result;
  }

 private:
  std::filesystem::path file_;
};

// bos_token and friends in tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<int32_t> configured_id(const json& config, const char* key,
                                     const Tokenizer& tokenizer,
                                     const std::filesystem::path& file) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return std::nullopt;
  const std::string token =
      found->is_object() ? found->at("content").get<std::string>() : found->get<std::string>();
  const auto id = tokenizer.find_id(token);
  if (!id) {
    throw std::runtime_error(file.string() + ": " + key + " '" + token +
                             "' is not a token of the tokenizer");
  }
  return id;
}

}  // namespace

BpeTokenizer::BpeTokenizer(const std::filesystem::path& tokenizer_json,
                           const std::optional<std::filesystem::path>& tokenizer_config) {
  const json root = read_json(tokenizer_json);
  const ComponentReader reader(tokenizer_json);
  try {
    nfc_ = reader.normalizer(root.value("normalizer", json()));
    const auto pre = reader.pre_tokenizer(root.value("pre_tokenizer", json()));
    for (const std::string& pattern : pre.split_patterns) split_regexes_.emplace_back(pattern);
    add_prefix_space_ = pre.add_prefix_space;
    if (pre.use_regex) byte_level_regex_.emplace(kGpt2SplitPattern);
    model_ = reader.model(root.at("model"));
    reader.decoder(root.value("decoder", json()));

    std::vector<AddedToken> raw, normalized;
    std::vector<std::string> raw_patterns, normalized_patterns;
    int32_t id_limit = model_->id_limit();
    for (AddedToken& token : reader.added_tokens(root.value("added_tokens", json()))) {
      added_ids_[token.content] = token.id;
      id_limit = std::max(id_limit, token.id + 1);
      if (token.normalized) {
        normalized_patterns.push_back(nfc_ ? utf8::nfc(token.content) : token.content);
        normalized.push_back(std::move(token));
      } else {
        raw_patterns.push_back(token.content);
        raw.push_back(std::move(token));
      }
    }

    // Every token, added ones too, goes through the ByteLevel decoder; text that is not
    // in its alphabet passes through unchanged.
    id_bytes_.resize(static_cast<std::size_t>(id_limit));
    for (int32_t id = 0; id < model_->id_limit(); ++id) {
      if (const std::string* text = model_->token_text(id)) {
        id_bytes_[id] = byte_level::to_bytes(*text).value_or(*text);
      }
    }
    for (const auto* tokens : {&raw, &normalized}) {
      for (const AddedToken& token : *tokens) {
        id_bytes_[token.id] = byte_level::to_bytes(token.content).value_or(token.content);
      }
    }
    raw_added_ = std::make_unique<AddedTokenMatcher>(std::move(raw), std::move(raw_patterns));
    normalized_added_ =
        std::make_unique<AddedTokenMatcher>(std::move(normalized), std::move(normalized_patterns));
  } catch (const json::exception& e) {
    reader.fail("structure", e.what());
  } catch (const std::invalid_argument& e) {
    reader.fail("content", e.what());
  }

  if (tokenizer_config) {
    const json config = read_json(*tokenizer_config);
    special_ids_.bos = configured_id(config, "bos_token", *this, *tokenizer_config);
    special_ids_.eos = configured_id(config, "eos_token", *this, *tokenizer_config);
    special_ids_.pad = configured_id(config, "pad_token", *this, *tokenizer_config);
  }
}

std::optional<int32_t> BpeTokenizer::find_id(std::string_view token) const {
  const auto added = added_ids_.find(token);
  if (added != added_ids_.end()) return added->second;
  return model_->find_id(token);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  utf8::check_valid(text, "text to tokenize");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (const TextPiece& raw : raw_added_->split(text)) {
    if (raw.added_id >= 0) {
      ids.push_back(raw.added_id);
      continue;
    }
    const std::string normalized = nfc_ ? utf8::nfc(raw.text) : std::string(raw.text);
    for (const TextPiece& piece : normalized_added_->split(normalized)) {
      if (piece.added_id >= 0) {
        ids.push_back(piece.added_id);
      } else {
        encode_plain(piece.text, ids);
      }
    }
  }
  return ids;
}

void BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> split;
  for (const UnicodeRegex& regex : split_regexes_) {
    split.clear();
    for (const std::string_view piece : pieces) regex.split_isolated(piece, split);
    pieces.swap(split);
  }
  std::string prefixed;
  std::vector<std::string_view> words;
  for (std::string_view piece : pieces) {
    if (add_prefix_space_ && !piece.starts_with(' ')) {
      prefixed.assign(1, ' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    words.clear();
    if (byte_level_regex_) {
      byte_level_regex_->split_isolated(piece, words);
    } else {
      words.push_back(piece);
    }
    for (const std::string_view word : words) model_->encode_word(word, ids);
  }
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_bytes_[id]) {
      throw std::out_of_range("cannot decode token id " + std::to_string(id) +
                              ": the tokenizer has no such id (vocab size " +
                              std::to_string(vocab_size()) + ")");
    }
    bytes += *id_bytes_[id];
  }
  // Single tokens may hold part of a character; only the whole sequence is made valid.
  return utf8::repair(bytes);
}

}  // namespace tandem
