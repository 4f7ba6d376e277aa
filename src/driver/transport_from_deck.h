// The weight transports between ranks as the deck asks for them (sync.*), for this rank's
// role (world/roles.h): the settings a trainer's ColocatedMemory builds its transport
// from, and a rollout rank's end of the transport.
#pragma once
#include <memory>

#include "deck/deck.h"
#include "model/parameters.h"
#include "sync/broadcast_transport.h"
#include "sync/disk_delta_transport.h"
#include "tensor/memory_pool.h"
#include "world/roles.h"
#include "world/world.h"

namespace tandem {

// Its transport is collective over the world's ranks: the trainers are the sources, the
// engines the rollout ranks, or every rank when colocated.
DiskDeltaSettings disk_delta_settings_from_deck(const Deck& deck, const ParameterLayout& layout, World& world, const Roles& roles);
BroadcastSettings broadcast_settings_from_deck(const Deck& deck, Roles& roles);

// A rollout rank's transport, which holds its engine's weights (sync.transport = broadcast or disk-delta).
std::unique_ptr<WeightTransport> engine_transport_from_deck(const Deck& deck, MemoryPool& pool, const ParameterLayout& layout,
                                                            DType dtype, World& world, Roles& roles);

}  // namespace tandem
