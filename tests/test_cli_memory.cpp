// The memory side of a run as the user sees it: the weight transports, the per-phase
// peaks in the run file, the memory plan in the log and the host limit's exit code.
#include <gtest/gtest.h>

#include <cmath>

#include "io/run_file.h"
#include "support.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

std::string short_run(const TempDir& dir, const std::string& name, const std::string& extra) {
  return tandem::testing::tandem_binary() + " --world.device=cpu --run.output-dir=" + dir.path().string() +
         " --run.name=" + name + " --run.steps=2 --sft.steps=1 --run.checkpoint-every=0 --run.samples-every=2 " + extra;
}

}  // namespace

// alias: the engine reads the trainer's working copy, so a sync moves nothing and the
// trainer's log-probs of the sampled tokens are the engine's; copy moves the weights.
TEST(CliMemory, AliasSyncMovesNothingAndLogprobsMatch) {
  TempDir dir;
  for (const std::string transport : {"alias", "copy"}) {
    SCOPED_TRACE(transport);
    const auto result = run_command(short_run(dir, transport, "--sync.transport=" + transport));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("memory plan"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("predicted / measured"), std::string::npos) << result.output;
    const RunFile run = RunFile::open(dir.path() / transport / kRunFileName);
    for (double bytes : run.metric("sync/bytes")) EXPECT_EQ(bytes == 0, transport == "alias") << bytes;
    for (const auto& sample : run.samples(2))
      for (size_t j = 0; j < sample.completion_tokens.size(); ++j)
        EXPECT_NEAR(sample.train_logp[j], sample.rollout_logp[j], 1e-5);
    // Every phase has its own peaks every step; start-up's come with the first step.
    for (const std::string phase : {"rollout", "after_generate", "train", "before_sync"})
      for (double rss : run.metric("memory/phase/" + phase + "/host_rss_peak")) EXPECT_GT(rss, 0) << phase;
    const std::vector<double> startup = run.metric("memory/phase/startup/host_rss_peak");
    ASSERT_EQ(startup.size(), 2u);
    EXPECT_GT(startup[0], 0);
    EXPECT_TRUE(std::isnan(startup[1]));
    // Start-up filled the pinned host cache beside its own work: no handoff allocated a buffer.
    for (double count : run.metric("memory/offload_host_allocations")) EXPECT_EQ(count, 0);
  }
}

// Without the pinned host cache every offload allocates its host buffers (so the count
// above is a real one).
TEST(CliMemory, WithoutThePinnedHostCacheEveryOffloadAllocates) {
  TempDir dir;
  const auto result = run_command(short_run(dir, "uncached", "--memory.pinned-host-cache=false"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<double> counts = RunFile::open(dir.path() / "uncached" / kRunFileName).metric("memory/offload_host_allocations");
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], counts[0]);
}

TEST(CliMemory, HostPeakAboveTheLimitStopsAtStartupWithExitTwo) {
  TempDir dir;
  const auto result = run_command(short_run(dir, "limit", "--memory.host-limit=1MiB"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("memory.host-limit"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("phase "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("1048576 bytes"), std::string::npos) << result.output;
}
