#include "driver/transport_from_deck.h"

#include <filesystem>

#include "driver/model_from_deck.h"

namespace tandem {

DiskDeltaSettings disk_delta_settings_from_deck(const Deck& deck, const ParameterLayout& layout, World& world, const Roles& roles) {
  DiskDeltaSettings settings;
  const std::string path = deck.get<std::string>("sync.path");
  settings.path = path.empty() ? std::filesystem::path(deck.get<std::string>("run.output-dir")) / deck.get<std::string>("run.name") / "weights"
                               : std::filesystem::path(path);
  settings.baseline = deck.get<std::string>("sync.baseline");
  settings.encoding = delta_encoding_from_name(deck.get<std::string>("sync.delta-encoding"));
  settings.compression_level = static_cast<int>(deck.get<int64_t>("sync.compression-level"));
  settings.keep_versions = static_cast<int>(deck.get<int64_t>("sync.keep-versions"));
  settings.initial_weights = [&deck, &layout] { return initial_weights_from_deck(deck, layout); };
  settings.comm = world.comm();
  settings.source_ranks = roles.split() ? roles.trainers() : world.size();
  settings.engine = roles.role() != Role::Trainer;
  return settings;
}

BroadcastSettings broadcast_settings_from_deck(const Deck& deck, Roles& roles) {
  return BroadcastSettings{deck.get<Bytes>("sync.bucket-bytes").value, roles.link_communicator()};
}

std::unique_ptr<WeightTransport> engine_transport_from_deck(const Deck& deck, MemoryPool& pool, const ParameterLayout& layout,
                                                            DType dtype, World& world, Roles& roles) {
  if (transport_kind_from_name(deck.get<std::string>("sync.transport")) == TransportKind::DiskDelta)
    return std::make_unique<DiskDeltaTransport>(pool, layout, nullptr, dtype, disk_delta_settings_from_deck(deck, layout, world, roles));
  return std::make_unique<BroadcastTransport>(pool, layout, dtype, broadcast_settings_from_deck(deck, roles), nullptr);
}

}  // namespace tandem
