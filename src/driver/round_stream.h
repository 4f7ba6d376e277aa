// A round on the rollout ranks that can end early (world.rollout-ranks > 0). Each engine
// samples its share of the round (engine_share) and sends every group to trainer rank 0
// the moment the group is scored. Trainer rank 0 places the groups in prompt order and
// ends the round as soon as its leading groups decide the step's batch (BatchDecision),
// when a stop signal or the time limit cuts the step, or when an engine fails: it tells
// every engine, and each one aborts what it still has queued or running (Engine::abort).
// Then every rank of the link joins the round's close, one all-gather of each engine's
// error, aborted requests, requests still held (none), graph setup seconds and messages
// sent, so trainer rank 0 receives every message before the next round, knows each
// engine's figures, and an engine's error fails every rank with its message.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "driver/engine_orders.h"
#include "driver/sampled_group.h"
#include "train/dynamic_sampling.h"

namespace tandem {

// A rollout rank's side of one round, from the Round order to its close.
class EngineRound {
 public:
  // Posts the receive of trainer rank 0's end of the round.
  explicit EngineRound(MPI_Comm link);
  EngineRound(const EngineRound&) = delete;
  EngineRound& operator=(const EngineRound&) = delete;

  // To trainer rank 0: a scored group, the error that stopped this engine (which the
  // close brings to every rank), or the stop signal it received (once).
  void send_group(const SampledGroup& group);
  void fail(ExitCode code, const std::string& message);
  void send_stop(const std::string& why);
  // Whether trainer rank 0 has ended the round (non-blocking).
  bool ended();
  // Collective over the link, once this engine is done, has aborted or failed: the
  // requests it aborted and those it still holds, and its graph setup seconds over the
  // round. Throws RanksFailedError, on every rank of the link, when any engine failed.
  void close(int64_t aborted, int64_t held, double graph_setup_seconds);

 private:
  MPI_Comm link_;
  std::string error_;  // an error reply, once failed
  MPI_Request end_ = MPI_REQUEST_NULL;
  int32_t ending_ = 0;
  int64_t sent_ = 0;
  bool stop_sent_ = false;
};

struct CollectedRound {
  // In prompt order: the leading groups that decided the batch, or every group of a round
  // that ran whole; none when a stop cut it.
  std::vector<SampledGroup> groups;
  std::string stopped;                // why a stop cut the round
  std::vector<int64_t> aborted;       // requests each engine aborted, in engine order
  double graph_setup_seconds = 0;     // the largest engine's
};

// Trainer rank 0, right after broadcasting the `round` order: collects its groups until
// `decision` is met, every group is in, `stop_requested` returns a reason (a stop signal
// on this rank, the time limit) or an engine sends one, or an engine fails; ends the
// round on every engine and joins the close. Throws RanksFailedError with every failed
// engine's message. `first_engine` is the job rank of the link's rank 1 (for the log).
CollectedRound collect_round(MPI_Comm link, const EngineCommand& round, const BatchDecision& decision,
                             const std::function<std::string()>& stop_requested, int first_engine);

}  // namespace tandem
