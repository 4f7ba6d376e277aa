#include "deck/same_deck_on_ranks.h"

#include <xxhash.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "world/errors.h"
#include "world/world.h"

namespace tandem {

namespace {

// "section.key = value" per option, in table order: equal texts, equal decks.
std::string values_text(const Deck& deck) {
  std::string text;
  for (const OptionSpec& spec : tandem_deck_schema().options) text += spec.key + " = " + deck.text(spec.key) + "\n";
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void require_same_deck_on_ranks(MPI_Comm comm, const Deck& deck) {
  const std::string mine = values_text(deck);
  uint64_t hash = XXH3_64bits(mine.data(), mine.size());
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<uint64_t> hashes(size);
  MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, comm);
  bool same = true;
  for (uint64_t other : hashes) same = same && other == hashes[0];
  if (same) return;

  // Rare and fatal: now every rank's values, to name the keys.
  const std::vector<std::string> texts = all_gather_strings(comm, mine);
  const std::vector<std::string> reference = lines_of(texts[0]);
  std::string message = "the ranks run different decks (every rank must run the same one):";
  for (int r = 1; r < size; ++r) {
    if (hashes[r] == hashes[0]) continue;
    const std::vector<std::string> lines = lines_of(texts[r]);
    for (size_t i = 0; i < lines.size() && i < reference.size(); ++i)
      if (lines[i] != reference[i]) message += "\n  rank " + std::to_string(r) + ": " + lines[i] + ", rank 0: " + reference[i];
  }
  throw RanksFailedError(kExitBadInput, message);
}

}  // namespace tandem
