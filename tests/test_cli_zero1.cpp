// ZeRO-1 (train.shard-optimizer) as a user runs it under mpirun on the CPU: the same steps
// as the unsharded run, a rank's share of the master weights and state in the pool's
// peaks, a bit-exact restart, and the refusals (the deck rule, another rank count).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "io/checkpoint.h"
#include "io/run_file.h"
#include "support.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

std::string mpirun_tandem(int np, const std::string& args) {
  return std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe ") +
         (getuid() == 0 ? "--allow-run-as-root " : "") + "-np " + std::to_string(np) + " " +
         tandem::testing::tandem_binary() + " " + args;
}

std::string run_args(const TempDir& dir, const std::string& name, int np, int steps) {
  return "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --run.steps=" + std::to_string(steps) + " --sft.steps=2 --run.checkpoint-every=2 --run.keep-checkpoints=5" +
         " --task.prompts-per-step=" + std::to_string(8 / np) + " --grpo.loss-aggregation=global-token-sum";
}

double last(const RunFile& run, const std::string& metric) { return run.metric(metric).back(); }

}  // namespace

// Sharded and unsharded over the same ranks: the same samples and, up to the order of the
// FP32 sums (the equivalence tolerance of the multi-rank runs), the same losses; each rank
// holds about 1/np of the master weights and optimizer state.
TEST(CliZero1, ShardedRunTakesTheUnshardedStepsWithAShareOfTheState) {
  TempDir dir;
  for (int np : {2, 4})
    for (const std::string optimizer : {"adamw", "muon"}) {
      SCOPED_TRACE(std::to_string(np) + " ranks, " + optimizer);
      const std::string name = optimizer + std::to_string(np);
      auto run = [&](const std::string& suffix, const std::string& extra) {
        const auto result =
            run_command(mpirun_tandem(np, run_args(dir, name + suffix, np, 4) + " --optimizer.name=" + optimizer + extra));
        EXPECT_EQ(result.exit_code, 0) << result.output;
        return RunFile::open(dir.path() / (name + suffix) / kRunFileName);
      };
      const RunFile whole = run("whole", "");
      const RunFile sharded = run("sharded", " --train.shard-optimizer=true");
      for (const char* metric : {"data_cursor", "reward_mean", "accuracy", "response_length"}) {
        const auto a = whole.metric(metric), b = sharded.metric(metric);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-12) << metric << " at step " << i + 1;
      }
      for (const char* metric : {"loss", "grad_norm"}) {
        const auto a = whole.metric(metric), b = sharded.metric(metric);
        for (size_t i = 0; i < a.size(); ++i)
          EXPECT_NEAR(b[i], a[i], 1e-4 * (1 + std::fabs(a[i]))) << metric << " at step " << i + 1;
      }
      // Rank 0's pool: its shard of the master weights and the two moments.
      for (const char* tag : {"memory/master_weights/device_peak", "memory/optimizer/device_peak"}) {
        const double full = last(whole, tag), share = last(sharded, tag);
        EXPECT_GT(share, 0) << tag;
        EXPECT_LT(share, full / np * 1.25) << tag;
        std::printf("%d ranks, %s, %s: %.0f -> %.0f bytes\n", np, optimizer.c_str(), tag, full, share);
      }
    }
}

// A sharded run interrupted after 4 steps and resumed from its checkpoint (the shards
// gathered into it, read back by each rank) takes the same steps as the run uninterrupted,
// bit for bit, with Muon's state in per-rank state files (optimizer.state = disk).
TEST(CliZero1, RestartOfAShardedRunIsBitExact) {
  TempDir dir;
  const std::string extra = " --train.shard-optimizer=true --optimizer.name=muon --optimizer.state=disk";
  EXPECT_EQ(run_command(mpirun_tandem(2, run_args(dir, "whole", 2, 6) + extra)).exit_code, 0);
  EXPECT_EQ(run_command(mpirun_tandem(2, run_args(dir, "split", 2, 6) + extra + " --run.steps-per-job=4")).exit_code, 0);
  const auto resumed = run_command(mpirun_tandem(2, run_args(dir, "split", 2, 6) + extra));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("ckpt_00000004.h5 at step 4"), std::string::npos) << resumed.output;
  const RunFile whole = RunFile::open(dir.path() / "whole" / kRunFileName);
  const RunFile split = RunFile::open(dir.path() / "split" / kRunFileName);
  for (const char* metric : {"data_cursor", "reward_mean", "accuracy", "loss", "grad_norm"})
    EXPECT_EQ(split.metric(metric), whole.metric(metric)) << metric;
  const Checkpoint a = Checkpoint::open(dir.path() / "whole" / "ckpt_00000006.h5");
  const Checkpoint b = Checkpoint::open(dir.path() / "split" / "ckpt_00000006.h5");
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& info : a.tensors()) {
    int64_t n = 1;
    for (int64_t extent : info.shape) n *= extent;
    std::vector<float> x(static_cast<size_t>(n)), y(x);
    a.read_tensor(info.name, Tensor::view(x.data(), info.dtype, Device::CPU, info.shape));
    b.read_tensor(info.name, Tensor::view(y.data(), info.dtype, Device::CPU, info.shape));
    EXPECT_EQ(x, y) << info.name;
  }
}

// The checkpoint of 2 sharded ranks resumed by 4: every rank stops together with exit 2,
// naming the checkpoint and both rank counts.
TEST(CliZero1, RestartOnAnotherRankCountIsRefused) {
  TempDir dir;
  const std::string extra = " --train.shard-optimizer=true";
  ASSERT_EQ(run_command(mpirun_tandem(2, run_args(dir, "two", 2, 2) + extra)).exit_code, 0);
  const auto result = run_command(mpirun_tandem(4, run_args(dir, "two", 4, 4) + extra));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("ckpt_00000002.h5 was written by 2 trainer ranks, this job has 4"), std::string::npos)
      << result.output;
}

TEST(CliZero1, ShardingNeedsTheAliasTransport) {
  const auto result = run_command(tandem::testing::tandem_binary() +
                                  " --check --train.shard-optimizer=true --sync.transport=copy");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  for (const char* text : {"train.shard-optimizer", "sync.transport = copy", "needs sync.transport = alias"})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
}
