// Where a round's groups come from: G sampled completions of each prompt, each scored by
// the task. A colocated rank samples with its own engine (LocalGroupSampler); trainer ranks
// ask the rollout ranks (RemoteRollout, rollout/remote_rollout.h), whose engines run a
// LocalGroupSampler in turn.
//
// Request ids and seeds follow the global prompt index and the step, never the rank or
// the engine that runs them: the same prompts get the same samples wherever they run.
#pragma once
#include <cstdint>
#include <vector>

#include "driver/sampled_group.h"
#include "rollout/engine.h"
#include "rollout/request.h"
#include "tasks/prompt_format.h"
#include "tasks/task.h"

namespace tandem {

class GroupSource {
 public:
  virtual ~GroupSource() = default;
  // The groups of global prompt indices [first, first + count) at `step`, in prompt order.
  virtual std::vector<SampledGroup> sample(int64_t step, uint64_t first, int64_t count) = 0;
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

  std::vector<SampledGroup> sample(int64_t step, uint64_t first, int64_t count) override;
  // The groups of any prompt indices, in their order, generated in one batch.
  std::vector<SampledGroup> sample_prompts(int64_t step, const std::vector<uint64_t>& indices);

 private:
  Engine& engine_;
  const Task& task_;
  const PromptFormat& format_;
  GroupSamplingSettings settings_;
};

}  // namespace tandem
