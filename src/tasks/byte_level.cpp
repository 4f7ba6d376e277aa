#include "tasks/byte_level.h"

#include "tasks/utf8_text.h"

namespace tandem::byte_level {
namespace {

// Every symbol is below U+0144: 256 bytes, of which 68 are moved up from U+0100.
constexpr char32_t kSymbolLimit = 0x144;

struct Alphabet {
  std::array<std::string, 256> symbols;
  std::array<int, kSymbolLimit> byte_of;  // -1 for a code point that stands for no byte

  Alphabet() {
    // Printable Latin-1 bytes stand for themselves; the others (controls, space, soft
    // hyphen...) are moved, in byte order, to U+0100 onwards.
    byte_of.fill(-1);
    char32_t next_free = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t code_point = printable ? static_cast<char32_t>(b) : next_free++;
      symbols[b] = utf8::encode(code_point);
      byte_of[code_point] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

const std::array<std::string, 256>& byte_symbols() { return alphabet().symbols; }

std::string to_symbols(std::string_view bytes) {
  const auto& symbols = alphabet().symbols;
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char b : bytes) text += symbols[static_cast<unsigned char>(b)];
  return text;
}

std::optional<std::string> to_bytes(std::string_view symbols) {
  const auto& byte_of = alphabet().byte_of;
  std::string bytes;
  bytes.reserve(symbols.size());
  for (std::size_t pos = 0; pos < symbols.size();) {
    const char32_t code_point = utf8::next_code_point(symbols, pos);
    if (code_point >= kSymbolLimit || byte_of[code_point] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte_of[code_point]));
  }
  return bytes;
}

}  // namespace tandem::byte_level
