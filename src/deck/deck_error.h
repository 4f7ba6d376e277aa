// Where a deck value came from, and the one error type for bad input.
#pragma once
#include <stdexcept>
#include <string>

#include "world/errors.h"

namespace tandem {

struct Source {
  enum class Kind { Default, File, CommandLine };
  Kind kind = Kind::Default;
  std::string file;  // Kind::File only
  int line = 0;      // Kind::File only

  static Source in_file(const std::string& file, int line) { return {Kind::File, file, line}; }
  static Source command_line() { return {Kind::CommandLine, "", 0}; }
  std::string describe() const;  // "default", "FILE:LINE" or "command line"
};

// what(): "FILE:LINE: key 'section.key': REASON". The line is left out when there is none
// (command line, a whole file) and the key when the error is about no single key.
struct DeckError : BadInputError {
  DeckError(const std::string& file, int line, const std::string& key, const std::string& reason);
  DeckError(const Source& source, const std::string& key, const std::string& reason);

  std::string file;  // "command line" for overrides, "default" for the built-in defaults
  int line;          // 1-based; 0 when there is none
  std::string key;
  std::string reason;
};

}  // namespace tandem
