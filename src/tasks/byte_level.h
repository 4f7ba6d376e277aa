// GPT-2's byte-level alphabet: a reversible map from each of the 256 byte values to a
// printable character, so that BPE vocabularies can spell any byte sequence as text
// (a space is stored as "Ġ", a newline as "Ċ").
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::byte_level {

// The UTF-8 spelling of the character that stands for each byte.
const std::array<std::string, 256>& byte_symbols();

// The byte-level spelling of raw bytes: what a vocabulary stores for them.
std::string to_symbols(std::string_view bytes);

// The raw bytes a vocabulary token spells; nullopt when the token holds a character outside
// the alphabet (Hugging Face's decoder then keeps such a token's text as it is).
std::optional<std::string> to_bytes(std::string_view symbols);

}  // namespace tandem::byte_level
