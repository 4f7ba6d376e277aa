// UTF-8 text helpers for the tokenizers: validation, NFC, code points, and the lossy
// repair that Hugging Face's decoders apply to byte sequences.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::utf8 {

// Throws std::invalid_argument naming `what` and the byte offset of the first invalid
// sequence when `text` is not valid UTF-8.
void check_valid(std::string_view text, std::string_view what);

// Unicode Normalization Form C of valid UTF-8 text.
std::string nfc(std::string_view text);

// Replaces every invalid sequence by U+FFFD the way Rust's String::from_utf8_lossy does
// (one replacement per maximal invalid subpart), so decoded text matches Hugging Face's.
std::string repair(std::string_view bytes);

// The code point starting at text[pos] of valid UTF-8 text; moves pos past it.
char32_t next_code_point(std::string_view text, std::size_t& pos);

std::string encode(char32_t code_point);

// "U+00E9": how error messages name a character.
std::string code_point_name(char32_t code_point);

// The Unicode White_Space property (what Rust's \s matches).
bool is_white_space(char32_t code_point);

// Rust regex's \w: letters, marks, decimal digits, connector punctuation, joiners.
bool is_word_character(char32_t code_point);

}  // namespace tandem::utf8
