// The trainer ranks' side of the rollout ranks (world.rollout-ranks > 0). Every trainer
// asks for its slice of a round, as a colocated rank would draw it; trainer rank 0 orders
// the whole round from the engines (each samples every K-th group), collects their groups
// until the batch is decided (round_stream.h), and hands each trainer the round, from
// which it takes its slice. Trainer rank 0 also gives the engines their other orders
// (engine_orders.h): the weight sync, the stop point, the end.
#pragma once
#include <mpi.h>

#include <functional>
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

  // Collective over the trainers (and, from trainer rank 0, the engines): this trainer's
  // groups [first, first + count) of a round that every trainer asks for at once, those
  // before the groups that decide the batch when the round ends early.
  RoundGroups sample(int64_t step, uint64_t first, int64_t count, const BatchDecision& decision) override;
  // What trainer rank 0 asks while a round runs: a reason to cut it (a stop signal, the
  // time limit), or "".
  void cut_rounds_when(std::function<std::string()> stop_requested) { stop_requested_ = std::move(stop_requested); }
  // Trainer rank 0 gives the engines an order without arguments (Sync, StartStopPoint,
  // StepBoundary), right before the collective it announces; other trainers do nothing.
  void announce(EngineOrder order);
  // The end of the run: the engines leave.
  void finish();

 private:
  Roles& roles_;
  std::function<std::string()> stop_requested_ = [] { return std::string(); };
  bool engines_left_ = false;  // told to finish, or failed with the trainers
};

}  // namespace tandem
