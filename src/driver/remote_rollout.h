// The trainer ranks' side of the rollout ranks (world.rollout-ranks > 0). Every trainer
// asks for its slice of a round, as a colocated rank would draw it; trainer rank 0 orders
// the whole round from the engines (each samples every K-th group), collects their groups
// until the batch is decided (round_stream.h), and hands each trainer the round, from
// which it takes its slice. Trainer rank 0 also gives the engines their other orders
// (engine_orders.h): the weight sync, the stop point, the end.
//
// Under rollout.max-staleness = 1 the step loop orders the next step's round ahead
// (prefetch) with the weights the engines hold, before the trainers train; the next
// sample() of that round collects it whole (gather_round), and a stop drops it (discard).
#pragma once
#include <mpi.h>

#include <functional>
#include <optional>
#include <string>

#include "driver/engine_orders.h"
#include "driver/group_sampler.h"
#include "driver/round_stream.h"
#include "world/roles.h"

namespace tandem {

class RemoteRollout final : public GroupSource {
 public:
  // Every trainer rank constructs one.
  explicit RemoteRollout(Roles& roles);
  // Without finish(), trainer rank 0 tells the engines that the trainers failed.
  ~RemoteRollout() override;
  RemoteRollout(const RemoteRollout&) = delete;
  RemoteRollout& operator=(const RemoteRollout&) = delete;

  // Collective over the trainers, and from trainer rank 0 the engines (ReportStartUp): an
  // engine's start-up error fails every rank together. Before any other order.
  void check_engines_started();
  // Collective over the trainers (and, from trainer rank 0, the engines): this trainer's
  // groups [first, first + count) of a round that every trainer asks for at once: the
  // prefetched round when it is this one, else a round that ends early once its first
  // groups decide the batch, and then only the groups before.
  RoundGroups sample(int64_t step, uint64_t first, int64_t count, const BatchDecision& decision) override;
  // What trainer rank 0 asks while a round runs: a reason to cut it (a stop signal, the
  // time limit), or "".
  void cut_rounds_when(std::function<std::string()> stop_requested) { stop_requested_ = std::move(stop_requested); }
  // Every trainer, at once: the engines sample the round of `step` whose sample() calls
  // will ask for [first + rank * count, ...) (trainer rank 0 orders it, from prompt
  // `first` on) and keep it until then. One round at a time.
  void prefetch(int64_t step, uint64_t first, int64_t count);
  bool prefetched() const { return prefetched_.has_value(); }
  // Every trainer, at once: the engines drop the prefetched round.
  void discard();
  // Trainer rank 0 gives the engines an order without arguments (Sync, StartStopPoint,
  // StepBoundary), right before the collective it announces; other trainers do nothing.
  void announce(EngineOrder order);
  // announce(order), then this trainer's part of the collective it announces. A failure
  // that every rank of the job agreed on there (RanksFailedError) has ended the engines too.
  template <class Collective>
  auto join(EngineOrder order, Collective&& collective) {
    announce(order);
    try {
      return collective();
    } catch (const RanksFailedError&) {
      engines_left_ = true;
      throw;
    }
  }
  // The end of the run: the engines leave.
  void finish();

 private:
  // Trainer rank 0 gives the engines `command`; the other trainers do nothing.
  void tell(const EngineCommand& command);
  // Collective over the trainers: trainer rank 0's reply from the engines, as groups (or
  // the stop that cut the round) on every trainer with the round's figures (the requests
  // the engines aborted, their graph setup seconds), or the error (error_reply) that
  // every trainer throws.
  RoundGroups hand_on(std::string reply, int64_t aborted, double graph_setup_seconds);

  Roles& roles_;
  std::function<std::string()> stop_requested_ = [] { return std::string(); };
  std::optional<EngineCommand> prefetched_;  // the round the engines keep, on every trainer
  bool engines_left_ = false;  // told to finish, or failed with the trainers
};

}  // namespace tandem
