// What trainer rank 0 tells the rollout ranks over the link (world/roles.h), and what
// they answer. A rollout rank waits for nothing but the next order, and every collective
// it joins follows one, so wherever the trainers end (done, stopped or failed) the
// engines hear of it instead of waiting in a collective the trainers never reach.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "driver/sampled_group.h"
#include "world/errors.h"

namespace tandem {

enum class EngineOrder : int64_t {
  Round,           // sample the prompts [first, first + count) of `step`, each engine its share
  Sync,            // receive the weights (the broadcast transport)
  StartStopPoint,  // construct the job's StopPoint (collective over every rank)
  StepBoundary,    // join StopPoint::agree
  Finish,          // the trainers are done: leave
  TrainersFailed,  // the trainers failed (rank 0's log says why): leave
};

struct EngineCommand {
  EngineOrder order = EngineOrder::Finish;
  int64_t step = 0;
  uint64_t first = 0;
  int64_t count = 0;
};

// Collective over the link: its rank 0 (trainer rank 0) sends `command`, every rank
// returns it.
EngineCommand broadcast_command(MPI_Comm link, const EngineCommand& command);

// The share of a round's prompt positions [0, count) that engine `engine` of `engines`
// samples: every engines-th one.
std::vector<uint64_t> engine_share(const EngineCommand& round, int engine, int engines);

// A rollout rank's answer to a round, and the trainers' copy of the whole round: the
// groups, or the error that stopped a rank.
std::string groups_reply(const std::vector<SampledGroup>& groups);
std::string error_reply(ExitCode code, const std::string& message);
// The groups of every reply, in reply order. Any error reply fails every rank that reads
// the same replies (RanksFailedError with each error, which names its rank). Empty
// replies (trainer rank 0's place in a gathering over the link) are skipped.
std::vector<SampledGroup> read_replies(const std::vector<std::string>& replies);

}  // namespace tandem
