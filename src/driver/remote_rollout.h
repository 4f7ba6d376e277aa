// The trainer ranks' side of the rollout ranks (world.rollout-ranks > 0). Every trainer
// asks for its slice of a round, as a colocated rank would draw it; trainer rank 0 orders
// the whole round from the engines (each samples every K-th group), gathers their groups,
// and hands each trainer the round, from which it takes its slice. Trainer rank 0 also
// gives the engines their other orders (engine_orders.h): the weight sync, the stop
// point, the end.
#pragma once
#include <mpi.h>

#include "driver/engine_orders.h"
#include "driver/group_sampler.h"
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
  // groups [first, first + count) of a round that every trainer asks for at once.
  std::vector<SampledGroup> sample(int64_t step, uint64_t first, int64_t count) override;
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
  Roles& roles_;
  bool engines_left_ = false;  // told to finish, or failed with the trainers
};

}  // namespace tandem
