// A rollout rank (world.rollout-ranks > 0): an engine and the task, no trainer, no
// optimizer state, no handoffs. It follows trainer rank 0's orders (engine_orders.h)
// until told to leave: samples and scores its share of each round, receives the weights,
// joins the job's stop point, so a signal or the time limit stops every rank together.
#pragma once
#include "deck/deck.h"
#include "model/config.h"
#include "model/parameters.h"
#include "world/roles.h"
#include "world/world.h"

namespace tandem {

// Returns the exit code; a failure the ranks agree on throws RanksFailedError.
int run_engine_rank(const Deck& deck, World& world, Roles& roles, const ModelConfig& model, const ParameterLayout& layout,
                    DType working_dtype);

}  // namespace tandem
