// What changed between two resolved decks (Deck::resolved_text), for a restart that
// resumes a checkpoint written under another deck: "section.key: old -> new" per key,
// in the order of the newer text; keys only one side has show as "(absent)".
#pragma once
#include <string>
#include <vector>

namespace tandem {

std::vector<std::string> changed_deck_keys(const std::string& before, const std::string& after);

}  // namespace tandem
