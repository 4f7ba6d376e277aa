#include "driver/optimizer_from_deck.h"

#include <algorithm>

#include "deck/deck_error.h"
#include "train/muon.h"
#include "world/world.h"

namespace tandem {

OptimizerSettings optimizer_settings_from_deck(const Deck& deck) {
  OptimizerSettings settings;
  settings.kind = optimizer_kind_from_name(deck.get<std::string>("optimizer.name"));
  const auto [beta1, beta2] = parse_betas(deck.get<std::string>("optimizer.betas"));  // checked by the deck's rules
  settings.adamw = AdamWSettings{.lr = 0,
                                 .beta1 = beta1,
                                 .beta2 = beta2,
                                 .eps = deck.get<double>("optimizer.eps"),
                                 .weight_decay = deck.get<double>("optimizer.weight-decay")};
  settings.momentum = deck.get<double>("optimizer.momentum");
  settings.state = optimizer_state_location_from_name(deck.get<std::string>("optimizer.state"));
  settings.state_path = deck.get<std::string>("optimizer.state-path");
  settings.chunk_bytes = deck.get<Bytes>("optimizer.chunk-bytes").value;
  return settings;
}

SlabShards optimizer_shard_from_deck(const Deck& deck, const ParameterLayout& layout, int ranks, int rank) {
  if (!deck.get<bool>("train.shard-optimizer")) return SlabShards::whole(layout);
  return SlabShards::split(layout, optimizer_kind_from_name(deck.get<std::string>("optimizer.name")), ranks, rank);
}

}  // namespace tandem

namespace tandem {

size_t optimizer_state_slot_bytes(const OptimizerSettings& settings, const ParameterLayout& layout) {
  size_t bytes = settings.chunk_bytes;
  if (settings.kind == OptimizerKind::Muon)
    for (const MuonGroup& group : muon_groups(layout))
      bytes = std::max(bytes, static_cast<size_t>(group.m * group.n) * sizeof(float));
  return bytes;
}

OptimizerStateStore optimizer_state_store_from_deck(const Deck& deck, const SlabShards& shard,
                                                    const std::filesystem::path& run_folder, Device device, int rank,
                                                    MPI_Comm comm) {
  const OptimizerSettings settings = optimizer_settings_from_deck(deck);
  OptimizerStateStore store;
  if (settings.state == OptimizerStateLocation::Device) return store;
  // AdamW's two moments (Muon's momentum is held in the first).
  const size_t bytes = 2 * static_cast<size_t>(shard.elements()) * sizeof(float);
  if (settings.state == OptimizerStateLocation::Host) {
    store.host = std::make_unique<PinnedMemory>(bytes, device);
    return store;
  }
  const std::filesystem::path folder = settings.state_path.empty() ? run_folder : settings.state_path;
  const std::filesystem::path path =
      folder / (deck.get<std::string>("run.name") + ".rank" + std::to_string(rank) + ".optimizer-state");
  std::string error;
  try {
    store.file = std::make_unique<OptimizerStateFile>(path, bytes);
  } catch (const std::runtime_error& failure) {
    error = failure.what();
  }
  try {
    fail_together(comm, error);
  } catch (const std::runtime_error& failure) {
    throw DeckError(deck.source("optimizer.state-path"), "optimizer.state-path", failure.what());
  }
  return store;
}

}  // namespace tandem
