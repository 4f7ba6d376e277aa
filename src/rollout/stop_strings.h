// Stop strings are matched on decoded text, since one string can be tokenized many ways
// and a token can carry a stop string together with more text ("\n\nThe").
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tasks/tokenizer.h"

namespace tandem {

// The first of `stops` found in the decoded text of the completion's last tokens, where
// the last token was just added. Only the tail is decoded, enough tokens to hold the
// longest stop string (every token decodes to at least one byte) plus a few for a
// character split at the window's start: a match that did not involve the last token
// would have been found one token earlier, so any match in the window is new. Ids the
// tokenizer does not have decode to nothing.
std::optional<std::string> find_stop_string(const Tokenizer& tokenizer, std::span<const int32_t> completion,
                                            const std::vector<std::string>& stops);

}  // namespace tandem
