#include "driver/group_sampler.h"

#include <map>
#include <utility>

namespace tandem {

LocalGroupSampler::LocalGroupSampler(Engine& engine, const Task& task, const PromptFormat& format,
                                     const GroupSamplingSettings& settings)
    : engine_(engine),
      task_(task),
      format_(format),
      settings_(settings),
      graph_setup_taken_(engine.stats().graph_setup_seconds) {}

RoundGroups LocalGroupSampler::sample(int64_t step, uint64_t first, int64_t count, const BatchDecision&) {
  std::vector<uint64_t> indices;
  for (int64_t i = 0; i < count; ++i) indices.push_back(first + static_cast<uint64_t>(i));
  RoundGroups round;
  round.groups = sample_prompts(step, indices);
  round.graph_setup_seconds = take_graph_setup_seconds();
  return round;
}

double LocalGroupSampler::take_graph_setup_seconds() {
  const double total = engine_.stats().graph_setup_seconds;
  return total - std::exchange(graph_setup_taken_, total);
}

std::vector<SampledGroup> LocalGroupSampler::sample_prompts(int64_t step, const std::vector<uint64_t>& indices) {
  std::map<uint64_t, size_t> position;
  for (size_t i = 0; i < indices.size(); ++i) position[indices[i]] = i;
  std::vector<SampledGroup> groups(indices.size());
  stream(step, indices, [&](SampledGroup&& group) { groups[position.at(group.prompt_index)] = std::move(group); },
         [] { return false; });
  return groups;
}

int64_t LocalGroupSampler::stream(int64_t step, const std::vector<uint64_t>& indices,
                                  const std::function<void(SampledGroup&&)>& scored, const std::function<bool()>& abort_now) {
  const int64_t group_size = settings_.group_size;
  std::vector<SampledGroup> groups(indices.size());
  std::vector<Prompt> prompts;
  std::vector<std::vector<Completion>> completions(indices.size(), std::vector<Completion>(group_size));
  std::vector<int64_t> missing(indices.size(), group_size);
  std::map<uint64_t, size_t> group_of;  // prompt index -> position in `indices`
  try {
    for (size_t i = 0; i < groups.size(); ++i) {
      SampledGroup& group = groups[i];
      group.prompt_index = indices[i];
      group_of[group.prompt_index] = i;
      prompts.push_back(task_.sample(group.prompt_index));
      group.prompt_text = format_.input_text(prompts.back().text);
      group.prompt = format_.input_ids(group.prompt_text);
      for (int64_t g = 0; g < group_size; ++g) {
        GenerationRequest request;
        request.id = group.prompt_index * static_cast<uint64_t>(group_size) + static_cast<uint64_t>(g);
        request.prompt = group.prompt;
        request.sampling = settings_.sampling;
        request.sampling.seed = settings_.seed * 1000003u + static_cast<uint64_t>(step) * 7919u;
        engine_.submit(std::move(request));
      }
    }
    while (engine_.has_work()) {
      if (abort_now()) return static_cast<int64_t>(engine_.abort().size());
      for (Completion& completion : engine_.step()) {
        const uint64_t prompt_index = completion.request_id / static_cast<uint64_t>(group_size);
        const size_t i = group_of.at(prompt_index);
        completions[i][completion.request_id % static_cast<uint64_t>(group_size)] = std::move(completion);
        if (--missing[i] > 0) continue;
        for (const Completion& done : completions[i]) {
          SampledGroup::Sample sample{done.tokens, done.logprobs, format_.completion_text(done.tokens)};
          const RewardBreakdown judged = task_.judge(prompts[i], sample.text);
          sample.reward = judged.total;
          sample.correct = judged.correct;
          sample.format = judged.format;
          groups[i].samples.push_back(std::move(sample));
        }
        completions[i].clear();
        scored(std::move(groups[i]));
      }
    }
  } catch (...) {
    engine_.abort();  // nothing stays queued or running
    throw;
  }
  return 0;
}

}  // namespace tandem
