// The byte-level BPE model: a vocabulary of byte-level tokens and the ranked merges that
// build them, applied to one pre-token at a time.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tasks/string_map.h"

namespace tandem {

class BpeModel {
 public:
  // `vocab` maps byte-level token text to its id; `merges` are the pairs in rank order.
  // `ignore_merges` (Llama 3): a pre-token that is itself in the vocabulary is one token.
  // `source` names the file in error messages.
  BpeModel(StringMap<int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           bool ignore_merges, const std::string& source);

  // Appends the ids of one pre-token, given as raw bytes. Thread-safe.
  void encode_word(std::string_view bytes, std::vector<int32_t>& ids) const;

  std::optional<int32_t> find_id(std::string_view token) const;
  // The byte-level text of a token; nullptr for an id the vocabulary lacks.
  const std::string* token_text(int32_t id) const;
  // One past the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  std::vector<int32_t> merge(std::string_view bytes) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id; empty where an id is unused
  std::array<int32_t, 256> byte_ids_;
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_;

  // Words recur constantly in text, so their merged ids are remembered.
  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace tandem
