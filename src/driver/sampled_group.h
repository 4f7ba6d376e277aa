// One prompt's group of sampled completions, as it travels between ranks: from a rollout
// rank to the trainers, and between trainers under dynamic sampling. Dynamic
// sampling keeps a group wherever it was drawn, yet every rank must train on an equal
// share of the kept groups (its trainer is sized for prompts-per-step groups), so the
// kept groups are gathered and dealt out again in the order of their prompt indices.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct SampledGroup {
  uint64_t prompt_index = 0;  // the global index the task drew the prompt from
  std::vector<int32_t> prompt;  // the ids the engine was fed
  std::string prompt_text;      // the text they encode (chat template included)
  struct Sample {
    std::vector<int32_t> tokens;  // the completion, stop id included
    std::vector<float> logprobs;  // the engine's, one per token
    std::string text;             // decoded, stop id excluded
    double reward = 0;
    double correct = 0, format = 0;  // the task's judgement (RewardBreakdown)
    bool operator==(const Sample&) const = default;
  };
  std::vector<Sample> samples;

  std::vector<double> rewards() const;
  bool operator==(const SampledGroup&) const = default;
};

// A byte string that read_groups turns back into the same groups, on any rank of the job.
std::string write_groups(const std::vector<SampledGroup>& groups);
// Throws std::runtime_error when `bytes` ends early or has bytes left over.
std::vector<SampledGroup> read_groups(std::string_view bytes);

// Collective: every rank's groups, rank 0's first, each rank's in its own order.
std::vector<SampledGroup> all_gather_groups(MPI_Comm comm, const std::vector<SampledGroup>& mine);

}  // namespace tandem
