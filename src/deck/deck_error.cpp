#include "deck/deck_error.h"

namespace tandem {
namespace {

std::string message(const std::string& file, int line, const std::string& key, const std::string& reason) {
  std::string text = file;
  if (line > 0) text.append(":").append(std::to_string(line));
  if (!key.empty()) text.append(": key '").append(key).append("'");
  return text.append(": ").append(reason);
}

}  // namespace

std::string Source::describe() const {
  switch (kind) {
    case Kind::Default: return "default";
    case Kind::File: return file + ":" + std::to_string(line);
    case Kind::CommandLine: return "command line";
  }
  return "";
}

DeckError::DeckError(const std::string& file, int line, const std::string& key, const std::string& reason)
    : BadInputError(message(file, line, key, reason)), file(file), line(line), key(key), reason(reason) {}

DeckError::DeckError(const Source& source, const std::string& key, const std::string& reason)
    : DeckError(source.kind == Source::Kind::File ? source.file : source.describe(), source.line, key, reason) {}

}  // namespace tandem
