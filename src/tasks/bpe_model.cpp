#include "tasks/bpe_model.h"

#include <queue>
#include <stdexcept>

#include "tasks/byte_level.h"

namespace tandem {
namespace {

// Bounds on the word cache: long words are rare and would only crowd it.
constexpr std::size_t kCacheCapacity = 1 << 16;
constexpr std::size_t kLongestCachedWord = 256;

}  // namespace

BpeModel::BpeModel(StringMap<int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   bool ignore_merges, const std::string& source)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  int32_t largest = -1;
  for (const auto& [text, id] : vocab_) {
    if (id < 0) throw std::runtime_error(source + ": token '" + text + "' has a negative id");
    largest = std::max(largest, id);
  }
  tokens_.resize(static_cast<std::size_t>(largest + 1));
  for (const auto& [text, id] : vocab_) {
    if (!tokens_[id].empty()) {
      throw std::runtime_error(source + ": id " + std::to_string(id) + " is used by both '" +
                               tokens_[id] + "' and '" + text + "'");
    }
    tokens_[id] = text;
  }

  const auto& symbols = byte_level::byte_symbols();
  for (int b = 0; b < 256; ++b) {
    const auto found = vocab_.find(symbols[b]);
    if (found == vocab_.end()) {
      throw std::runtime_error(source + ": the vocabulary lacks the byte-level token '" +
                               symbols[b] + "' for byte " + std::to_string(b) +
                               "; only byte-level BPE vocabularies are supported");
    }
    byte_ids_[b] = found->second;
  }

  merges_.reserve(merges.size());
  std::string joined;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto id_of = [&](std::string_view text) {
      const auto found = vocab_.find(text);
      if (found == vocab_.end()) {
        throw std::runtime_error(source + ": merge " + std::to_string(rank) + " ('" + left +
                                 "', '" + right + "') uses '" + std::string(text) +
                                 "', which is not in the vocabulary");
      }
      return found->second;
    };
    joined.assign(left).append(right);
    const int32_t merged = id_of(joined);
    // A pair listed twice keeps its last rank, as in Hugging Face's loader.
    merges_.insert_or_assign(pair_key(id_of(left), id_of(right)),
                             Merge{static_cast<int32_t>(rank), merged});
  }
}

std::optional<int32_t> BpeModel::find_id(std::string_view token) const {
  const auto found = vocab_.find(token);
  if (found == vocab_.end()) return std::nullopt;
  return found->second;
}

const std::string* BpeModel::token_text(int32_t id) const {
  if (id < 0 || id >= id_limit() || tokens_[id].empty()) return nullptr;
  return &tokens_[id];
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& ids) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    if (const auto whole = find_id(byte_level::to_symbols(bytes))) {
      ids.push_back(*whole);
      return;
    }
  }
  const bool cacheable = bytes.size() <= kLongestCachedWord;
  if (cacheable) {
    const std::lock_guard lock(cache_mutex_);
    const auto found = cache_.find(bytes);
    if (found != cache_.end()) {
      ids.insert(ids.end(), found->second.begin(), found->second.end());
      return;
    }
  }
  std::vector<int32_t> word = merge(bytes);
  ids.insert(ids.end(), word.begin(), word.end());
  if (cacheable) {
    const std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(bytes), std::move(word));
  }
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties) until no pair has
// a merge: Hugging Face's order, kept with a heap of candidate pairs over a linked list of
// symbols so that long words (CJK runs) cost n log n rather than n².
std::vector<int32_t> BpeModel::merge(std::string_view bytes) const {
  struct Symbol {
    int32_t id;
    int32_t prev;  // -1 at the start
    int32_t next;  // size at the end
    bool alive;
  };
  const auto n = static_cast<int32_t>(bytes.size());
  std::vector<Symbol> symbols(bytes.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(bytes[i])], i - 1, i + 1, true};
  }

  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the pair's left symbol
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right >= n) return;
    const auto found = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (found != merges_.end()) queue.push({found->second.rank, left, found->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next >= n) continue;
    // A candidate is stale when either side has merged since it was queued.
    const auto current = merges_.find(pair_key(left.id, symbols[left.next].id));
    if (current == merges_.end() || current->second.merged_id != top.merged_id) continue;

    Symbol& right = symbols[left.next];
    right.alive = false;
    left.id = top.merged_id;
    left.next = right.next;
    if (right.next < n) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }

  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

}  // namespace tandem
