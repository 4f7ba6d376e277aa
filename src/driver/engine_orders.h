// What trainer rank 0 tells the rollout ranks over the link (world/roles.h), and what
// they answer. A rollout rank waits for nothing but the next order, and every collective
// it joins follows one, so wherever the trainers end (done, stopped or failed) the
// engines hear of it instead of waiting in a collective the trainers never reach.
//
// A round is two orders: Round samples it and each engine keeps its groups, Collect
// gathers them to trainer rank 0. Under rollout.max-staleness = 1 other orders come in
// between (the step boundary, the weight sync): the engines sample the next step's round
// while the trainers train, and no collective of theirs waits on the sampling.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "driver/sampled_group.h"
#include "world/errors.h"

namespace tandem {

enum class EngineOrder : int64_t {
  ReportStartUp,   // whether this engine started: an engine's start-up error fails every rank together
  Round,           // sample the prompts [first, first + count) of `step`, each engine its share, and keep them
  StreamedRound,   // sample them, each engine its share, sending each group as it is scored (round_stream.h)
  Collect,         // send the kept round's groups (gather_round)
  Discard,         // drop the kept round (a stop after a prefetched round)
  Sync,            // receive the weights (the broadcast or disk-delta transport)
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

// What travels about a round (round_stream.h, remote_rollout.h): groups, the error that
// failed it, or the stop that cut it.
std::string groups_reply(const std::vector<SampledGroup>& groups);
std::string error_reply(ExitCode code, const std::string& message);
std::string stop_reply(const std::string& why);
enum class ReplyKind { Groups, Error, Stop };
ReplyKind reply_kind(const std::string& reply);

// Throws RanksFailedError with every error reply's message and the first one's code; does
// nothing when there is none.
void throw_errors(const std::vector<std::string>& replies);

// Collective over the link: every rollout rank's reply (trainer rank 0 passes ""). Any
// error reply fails every rank of the link together (RanksFailedError with each error,
// which names its rank).
void fail_together_on_link(MPI_Comm link, const std::string& reply);

// A kept round as trainer rank 0 gathers it: every engine's groups (in engine order) and
// the largest of their graph setup seconds over the round.
struct GatheredRound {
  std::vector<SampledGroup> groups;
  double graph_setup_seconds = 0;
};
// Collective over the link: fail_together_on_link, then trainer rank 0 returns the round
// and the engines return nothing: the groups travel to trainer rank 0 alone. Each rank
// gives its reply and its graph setup seconds over the round (trainer rank 0: "" and 0).
GatheredRound gather_round(MPI_Comm link, const std::string& reply, double graph_setup_seconds);

// The groups of a groups reply; throws the error of an error reply; a stop reply's reason
// goes to `stopped`, with no groups.
std::vector<SampledGroup> read_reply(const std::string& reply, std::string& stopped);

}  // namespace tandem
