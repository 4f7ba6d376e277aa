#include "train/optimizer_state_chunks.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "train/muon.h"

namespace tandem {

std::vector<StateChunk> plan_state_chunks(std::span<const SlabPiece> pieces, size_t slot_elements) {
  if (slot_elements < 2)
    throw std::invalid_argument("optimizer state chunks of " + std::to_string(slot_elements) +
                                " values cannot hold one element's two moments");
  const size_t half = slot_elements / 2;
  std::vector<StateChunk> chunks;
  for (const SlabPiece& piece : pieces) {
    size_t done = 0;
    const size_t numel = static_cast<size_t>(piece.count);
    while (done < numel) {
      if (chunks.empty() || chunks.back().elements == half) chunks.emplace_back();
      StateChunk& chunk = chunks.back();
      const size_t count = std::min(numel - done, half - chunk.elements);
      chunk.pieces.push_back({piece.tensor, static_cast<size_t>(piece.offset) + done, count, chunk.elements,
                              half + chunk.elements});
      chunk.elements += count;
      done += count;
    }
  }
  return chunks;
}

std::vector<MuonChunk> plan_muon_chunks(const std::vector<MuonGroup>& groups, size_t slot_elements) {
  std::vector<MuonChunk> chunks;
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t elements = static_cast<size_t>(groups[g].m * groups[g].n);
    if (elements > slot_elements)
      throw std::invalid_argument("optimizer state chunks of " + std::to_string(slot_elements) +
                                  " values cannot hold a Muon matrix of " + std::to_string(elements));
    for (size_t j = 0; j < groups[g].matrices.size(); ++j) {
      if (chunks.empty() || chunks.back().group != g || chunks.back().elements + elements > slot_elements)
        chunks.push_back(MuonChunk{g, j, j, {}, 0});
      MuonChunk& chunk = chunks.back();
      chunk.momentum.push_back(static_cast<int64_t>(chunk.elements));
      chunk.elements += elements;
      chunk.last = j + 1;
    }
  }
  return chunks;
}

}  // namespace tandem
