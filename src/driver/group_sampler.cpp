#include "driver/group_sampler.h"

namespace tandem {

LocalGroupSampler::LocalGroupSampler(Engine& engine, const Task& task, const PromptFormat& format,
                                     const GroupSamplingSettings& settings)
    : engine_(engine), task_(task), format_(format), settings_(settings) {}

std::vector<SampledGroup> LocalGroupSampler::sample(int64_t step, uint64_t first, int64_t count) {
  std::vector<uint64_t> indices;
  for (int64_t i = 0; i < count; ++i) indices.push_back(first + static_cast<uint64_t>(i));
  return sample_prompts(step, indices);
}

std::vector<SampledGroup> LocalGroupSampler::sample_prompts(int64_t step, const std::vector<uint64_t>& indices) {
  const int64_t group_size = settings_.group_size;
  std::vector<SampledGroup> groups(indices.size());
  std::vector<Prompt> prompts;
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < groups.size(); ++i) {
    SampledGroup& group = groups[i];
    group.prompt_index = indices[i];
    prompts.push_back(task_.sample(group.prompt_index));
    group.prompt_text = format_.input_text(prompts.back().text);
    group.prompt = format_.input_ids(group.prompt_text);
    for (int64_t g = 0; g < group_size; ++g) {
      GenerationRequest request;
      request.id = group.prompt_index * static_cast<uint64_t>(group_size) + static_cast<uint64_t>(g);
      request.prompt = group.prompt;
      request.sampling = settings_.sampling;
      request.sampling.seed = settings_.seed * 1000003u + static_cast<uint64_t>(step) * 7919u;
      requests.push_back(std::move(request));
    }
  }
  const std::vector<Completion> completions = engine_.generate(requests);
  for (size_t r = 0; r < completions.size(); ++r) {
    const Completion& completion = completions[r];
    SampledGroup::Sample sample{completion.tokens, completion.logprobs, format_.completion_text(completion.tokens)};
    const RewardBreakdown judged = task_.judge(prompts[r / group_size], sample.text);
    sample.reward = judged.total;
    sample.correct = judged.correct;
    sample.format = judged.format;
    groups[r / group_size].samples.push_back(std::move(sample));
  }
  return groups;
}

}  // namespace tandem
