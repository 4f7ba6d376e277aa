#include "tasks/utf8_text.h"

#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace tandem::utf8 {
namespace {

struct Sequence {
  std::size_t length;  // bytes consumed: the whole character, or the maximal invalid subpart
  bool valid;
};

// Reads one sequence by the Unicode standard's table of well-formed byte sequences
// (Table 3-7), which also defines the "maximal subpart" that one U+FFFD replaces.
Sequence scan(std::string_view bytes, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return {1, true};
  std::size_t continuation_bytes = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation_bytes = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation_bytes = 2;
    if (lead == 0xE0) second_low = 0xA0;  // no overlong forms
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation_bytes = 3;
    if (lead == 0xF0) second_low = 0x90;  // no overlong forms
    if (lead == 0xF4) second_high = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false};
  }
  std::size_t length = 1;
  for (std::size_t k = 0; k < continuation_bytes; ++k) {
    const std::size_t i = pos + length;
    if (i >= bytes.size()) return {length, false};
    const unsigned char low = k == 0 ? second_low : 0x80;
    const unsigned char high = k == 0 ? second_high : 0xBF;
    if (byte(i) < low || byte(i) > high) return {length, false};
    ++length;
  }
  return {length, true};
}

}  // namespace

void check_valid(std::string_view text, std::string_view what) {
  for (std::size_t pos = 0; pos < text.size();) {
    const Sequence sequence = scan(text, pos);
    if (!sequence.valid) {
      throw std::invalid_argument(std::string(what) + ": invalid UTF-8 at byte offset " +
                                  std::to_string(pos));
    }
    pos += sequence.length;
  }
}

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);  // ASCII is already in every normal form

  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    throw std::invalid_argument(std::string("NFC normalisation failed: ") +
                                utf8proc_errmsg(length));
  }
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(length));
}

std::string repair(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (std::size_t pos = 0; pos < bytes.size();) {
    const Sequence sequence = scan(bytes, pos);
    if (sequence.valid) {
      text.append(bytes.substr(pos, sequence.length));
    } else {
      text.append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER
    }
    pos += sequence.length;
  }
  return text;
}

char32_t next_code_point(std::string_view text, std::size_t& pos) {
  utf8proc_int32_t code_point = 0;
  const utf8proc_ssize_t length =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                       static_cast<utf8proc_ssize_t>(text.size() - pos), &code_point);
  if (length <= 0) {
    throw std::invalid_argument("invalid UTF-8 at byte offset " + std::to_string(pos));
  }
  pos += static_cast<std::size_t>(length);
  return static_cast<char32_t>(code_point);
}

std::string encode(char32_t code_point) {
  utf8proc_uint8_t buffer[4];
  const utf8proc_ssize_t length =
      utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point), buffer);
  if (length <= 0) {
    throw std::invalid_argument("cannot encode " + code_point_name(code_point) + " as UTF-8");
  }
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(length));
}

std::string code_point_name(char32_t code_point) {
  char name[16];
  std::snprintf(name, sizeof name, "U+%04X", static_cast<unsigned>(code_point));
  return name;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_word_character(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace tandem::utf8
