#include "tasks/tokenizer.h"

#include <stdexcept>

#include "tasks/bpe_tokenizer.h"

namespace tandem {

int32_t Tokenizer::id_of(std::string_view token) const {
  const auto id = find_id(token);
  if (!id) throw std::invalid_argument("the tokenizer has no token '" + std::string(token) + "'");
  return *id;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(path) ? path / "tokenizer.json" : path;
  if (!fs::is_regular_file(file)) {
    throw std::runtime_error(file.string() + ": no tokenizer.json there");
  }
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  return std::make_unique<BpeTokenizer>(
      file, fs::is_regular_file(config) ? std::optional<fs::path>(config) : std::nullopt);
}

}  // namespace tandem
