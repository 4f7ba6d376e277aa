// Where a round's groups come from: G sampled completions of each prompt, each scored by
// the task. A colocated rank samples with its own engine (LocalGroupSampler); trainer ranks
// ask the rollout ranks (RemoteRollout, rollout/remote_rollout.h), whose engines run a
// LocalGroupSampler in turn.
//
// Request ids and seeds follow the global prompt index and the step, never the rank or
// the engine that runs them: the same prompts get the same samples wherever they run.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "driver/sampled_group.h"
#include "rollout/engine.h"
#include "rollout/request.h"
#include "tasks/prompt_format.h"
#include "tasks/task.h"
#include "train/dynamic_sampling.h"

namespace tandem {

// What a rank gets of one round.
struct RoundGroups {
  // Its groups, in prompt order: all it asked for, or, when the round ended early, those
  // before the groups that decide the batch (the rest were not all sampled).
  std::vector<SampledGroup> groups;
  int64_t aborted_requests = 0;  // over every engine
  // What the decode sizes its engine ran for the first time cost it (eager first run,
  // CUDA graph capture: EngineStats::graph_setup_seconds); the largest of the engines'
  // on rollout ranks, which run at once.
  double graph_setup_seconds = 0;
  std::string stopped;  // not empty: a stop cut the round (why), and `groups` is void
};

class GroupSource {
 public:
  virtual ~GroupSource() = default;
  // This rank's groups of global prompt indices [first, first + count) at `step`, in
  // prompt order, out of a round that every rank asks for at once (each its slice). The
  // round may end as soon as its leading groups decide the batch (`decision`).
  virtual RoundGroups sample(int64_t step, uint64_t first, int64_t count, const BatchDecision& decision) = 0;
};

struct GroupSamplingSettings {
  int64_t group_size = 1;
  uint64_t seed = 0;  // run.seed
  SamplingParams sampling;
};

class LocalGroupSampler final : public GroupSource {
 public:
  // All three must outlive the sampler.
  LocalGroupSampler(Engine& engine, const Task& task, const PromptFormat& format, const GroupSamplingSettings& settings);

  // The whole slice: one rank's engine cannot end a round that other ranks share.
  RoundGroups sample(int64_t step, uint64_t first, int64_t count, const BatchDecision& decision) override;
  // The groups of any prompt indices, in their order, generated in one batch.
  std::vector<SampledGroup> sample_prompts(int64_t step, const std::vector<uint64_t>& indices);
  // Generates the groups of any prompt indices in one batch and hands each to `scored` as
  // soon as its G completions are scored (in the order they finish). Between engine steps
  // it asks `abort_now`; once that says yes it ends every request still queued or running
  // (Engine::abort) and returns how many; else 0. An error aborts them too, then throws.
  int64_t stream(int64_t step, const std::vector<uint64_t>& indices, const std::function<void(SampledGroup&&)>& scored,
                 const std::function<bool()>& abort_now);
  // The engine's graph setup seconds since the last call (since construction, at first):
  // what the sampling in between cost it.
  double take_graph_setup_seconds();

 private:
  Engine& engine_;
  const Task& task_;
  const PromptFormat& format_;
  GroupSamplingSettings settings_;
  double graph_setup_taken_;  // the engine's total at the last take
};

}  // namespace tandem
