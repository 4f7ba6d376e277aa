// The rollout manager with 1, 2 and 4 engine instances on their own threads: the tokens
// do not depend on the number of instances; over-sampling, a time limit, an abort from
// another thread and shutdown each stop every instance, after which none is generating or
// holds a KV block, and every sample cut short is reported as aborted, never as finished.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "rollout/manager.h"
#include "test_rollout_support.h"

namespace tandem {
namespace {

using testing::random_prompt;
using testing::RolloutRig;

struct Rollout {
  explicit Rollout(int instances, EngineOptions options = testing::small_engine_options())
      : rig(testing::tiny_config(true, false, true)) {
    std::vector<std::unique_ptr<Engine>> engines;
    for (int i = 0; i < instances; ++i) {
      options.name = "engine" + std::to_string(i);
      engines.push_back(rig.make_engine(options));
    }
    manager = std::make_unique<RolloutManager>(std::move(engines));
  }
  RolloutRig rig;
  std::unique_ptr<RolloutManager> manager;
};

// Long enough (seconds on one core) that nothing finishes before an abort comes.
constexpr int kLong = 2000;

EngineOptions long_options() {
  EngineOptions options = testing::small_engine_options();
  options.max_sequence_length = kLong + 32;
  options.kv_cache_bytes = size_t{8} << 20;
  return options;
}

std::vector<RolloutPrompt> prompts(int groups, int samples, int max_new, float temperature = 1.0f) {
  std::vector<RolloutPrompt> all;
  for (int g = 0; g < groups; ++g) {
    RolloutPrompt prompt;
    prompt.prompt = random_prompt(2 + (g * 5) % 11, 32, 40 + g);
    prompt.samples = samples;
    prompt.sampling.temperature = temperature;
    prompt.sampling.max_new_tokens = max_new;
    prompt.sampling.seed = 99;
    all.push_back(prompt);
  }
  return all;
}

void expect_all_idle(const RolloutManager& manager) {
  for (const InstanceStatus& status : manager.status()) {
    EXPECT_EQ(status.running, 0u);
    EXPECT_EQ(status.waiting, 0u);
    EXPECT_EQ(status.free_blocks, status.total_blocks);
  }
}

// Tokens by prompt and sample.
std::vector<std::vector<std::vector<int32_t>>> tokens_of(const RolloutResult& result, size_t groups) {
  std::vector<std::vector<std::vector<int32_t>>> tokens(groups);
  for (const RolloutGroup& group : result.completed)
    for (const Completion& sample : group.samples) tokens[group.index].push_back(sample.tokens);
  return tokens;
}

TEST(RolloutManager, TokensDoNotDependOnTheNumberOfInstances) {
  const std::vector<RolloutPrompt> work = prompts(6, 3, 12);
  std::vector<std::vector<std::vector<int32_t>>> reference;
  for (int instances : {1, 2, 4}) {
    Rollout rollout(instances);
    const RolloutResult result = rollout.manager->generate(work);
    EXPECT_TRUE(result.abort_reason.empty());
    EXPECT_TRUE(result.aborted.empty());
    ASSERT_EQ(result.completed.size(), 6u);
    for (const RolloutGroup& group : result.completed) {
      EXPECT_EQ(group.instance, static_cast<int>(group.index % instances));
      ASSERT_EQ(group.samples.size(), 3u);
      for (const Completion& sample : group.samples) {
        EXPECT_EQ(sample.finish, FinishReason::Length);
        EXPECT_EQ(sample.tokens.size(), 12u);
      }
      // Samples of one group differ: each has its own stream.
      EXPECT_NE(group.samples[0].tokens, group.samples[1].tokens);
    }
    const auto tokens = tokens_of(result, work.size());
    if (reference.empty())
      reference = tokens;
    else
      EXPECT_EQ(tokens, reference) << instances << " instances";
    expect_all_idle(*rollout.manager);
  }
}

void expect_aborted_samples_are_marked(const RolloutResult& result) {
  for (const RolloutGroup& group : result.completed)
    for (const Completion& sample : group.samples) EXPECT_NE(sample.finish, FinishReason::Abort);
  for (const RolloutGroup& group : result.aborted) {
    EXPECT_FALSE(group.complete());
    for (const Completion& sample : group.samples) {
      EXPECT_EQ(sample.tokens.size(), sample.logprobs.size());
      // Aborted samples never reach their length: every one was cut short.
      if (sample.finish == FinishReason::Abort) EXPECT_LT(sample.tokens.size(), static_cast<size_t>(kLong));
    }
  }
}

class RolloutAbort : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Instances, RolloutAbort, ::testing::Values(1, 2, 4));

void wait_until(const std::function<bool()>& condition) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!condition()) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "timed out waiting";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Long generations (8 sequences per instance) stopped from another thread once every
// instance is generating.
TEST_P(RolloutAbort, AbortFromAnotherThreadReachesEveryInstance) {
  const int instances = GetParam();
  Rollout rollout(instances, long_options());
  RolloutResult result;
  std::thread runner([&] { result = rollout.manager->generate(prompts(4 * instances, 2, kLong)); });
  wait_until([&] {
    for (const InstanceStatus& status : rollout.manager->status())
      if (status.running == 0 || status.stats.generated_tokens == 0) return false;
    return true;
  });
  rollout.manager->abort("test abort");
  runner.join();

  EXPECT_EQ(result.abort_reason, "test abort");
  EXPECT_TRUE(result.completed.empty());
  ASSERT_EQ(result.aborted.size(), static_cast<size_t>(4 * instances));
  std::vector<int> cut_short(instances, 0);
  for (const RolloutGroup& group : result.aborted)
    for (const Completion& sample : group.samples)
      if (sample.finish == FinishReason::Abort && !sample.tokens.empty()) ++cut_short[group.instance];
  for (int i = 0; i < instances; ++i) EXPECT_GT(cut_short[i], 0) << "instance " << i << " was not flushed";
  expect_aborted_samples_are_marked(result);
  expect_all_idle(*rollout.manager);

  // The instances take new work afterwards.
  const RolloutResult again = rollout.manager->generate(prompts(instances, 1, 4));
  EXPECT_EQ(again.completed.size(), static_cast<size_t>(instances));
  expect_all_idle(*rollout.manager);
}

TEST_P(RolloutAbort, OverSamplingStopsOnceEnoughGroupsAreComplete) {
  const int instances = GetParam();
  Rollout rollout(instances, long_options());
  // Groups 0..2 are short, the rest long: the short ones complete first.
  std::vector<RolloutPrompt> work = prompts(3 + 3 * instances, 2, kLong);
  for (int g = 0; g < 3; ++g) work[g].sampling.max_new_tokens = 3;
  const RolloutResult result = rollout.manager->generate(work, {3, Seconds{0}});
  EXPECT_NE(result.abort_reason.find("over-sampling"), std::string::npos) << result.abort_reason;
  EXPECT_GE(result.completed.size(), 3u);
  EXPECT_EQ(result.completed.size() + result.aborted.size(), work.size());
  EXPECT_FALSE(result.aborted.empty());
  for (const RolloutGroup& group : result.completed) EXPECT_TRUE(group.complete());
  expect_aborted_samples_are_marked(result);
  expect_all_idle(*rollout.manager);
}

TEST_P(RolloutAbort, TimeLimitAbortsWhatIsLeft) {
  const int instances = GetParam();
  Rollout rollout(instances, long_options());
  const RolloutResult result = rollout.manager->generate(prompts(2 * instances, 4, kLong), {0, Seconds{0.05}});
  EXPECT_NE(result.abort_reason.find("time limit"), std::string::npos) << result.abort_reason;
  EXPECT_FALSE(result.aborted.empty());
  EXPECT_LT(result.seconds, 30.0);
  expect_aborted_samples_are_marked(result);
  expect_all_idle(*rollout.manager);
}

TEST(RolloutManager, ShutdownEndsARunningGenerateAndRefusesMore) {
  Rollout rollout(2, long_options());
  RolloutResult result;
  std::thread runner([&] { result = rollout.manager->generate(prompts(4, 2, kLong)); });
  wait_until([&] { return rollout.manager->status()[1].stats.generated_tokens > 0; });
  rollout.manager->shutdown();
  runner.join();
  EXPECT_EQ(result.abort_reason, "shutdown");
  EXPECT_EQ(result.aborted.size(), 4u);
  expect_aborted_samples_are_marked(result);
  expect_all_idle(*rollout.manager);
  EXPECT_THROW(rollout.manager->generate(prompts(1, 1, 2)), std::logic_error);
  rollout.manager->shutdown();  // twice is fine
}

TEST(RolloutManager, ChecksRequestsBeforeHandingAnyOut) {
  Rollout rollout(2);
  std::vector<RolloutPrompt> work = prompts(3, 2, 4);
  work[2].prompt.push_back(999);  // outside the vocabulary
  EXPECT_THROW(rollout.manager->generate(work), std::invalid_argument);
  work[2].prompt.pop_back();
  work[1].samples = 0;
  EXPECT_THROW(rollout.manager->generate(work), std::invalid_argument);
  expect_all_idle(*rollout.manager);
  work[1].samples = 2;
  EXPECT_EQ(rollout.manager->generate(work).completed.size(), 3u);
  EXPECT_THROW(RolloutManager(std::vector<std::unique_ptr<Engine>>{}), std::invalid_argument);
}

}  // namespace
}  // namespace tandem
