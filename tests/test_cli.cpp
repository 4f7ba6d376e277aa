// The tandem program as a user drives it: --help, --check, deck errors and their exit
// code, a short run on the CPU with checkpoints, and a restart that resumes it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/run_file.h"
#include "model/hf_import.h"
#include "support.h"
#include "test_rollout_support.h"
#include "tiny_hf_folder.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

std::string tandem_cmd(const std::string& args) { return tandem::testing::tandem_binary() + " " + args; }

std::string mpirun(int np) {
  return std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe ") +
         (getuid() == 0 ? "--allow-run-as-root " : "") + "-np " + std::to_string(np) + " ";
}

std::string short_run(const TempDir& dir, const std::string& name, int steps) {
  return "--world.device=cpu --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --run.steps=" + std::to_string(steps) + " --sft.steps=3 --run.checkpoint-every=2 --run.keep-checkpoints=5";
}

}  // namespace

TEST(Cli, HelpListsEveryOptionBySection) {
  const auto result = run_command(tandem_cmd("--help"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"usage:", "[run]", "[world]", "[memory]", "[model]", "colocate-memory-peak-device", "keep-checkpoints"})
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
}

// The revision is refreshed at every build, not only when cmake configures: the binary
// names the checkout's HEAD, "-dirty" when tracked files differ from it.
TEST(Cli, VersionNamesTheRevisionOfTheCheckout) {
  const std::string git = "git -C " + tandem::testing::source_dir().string();
  const auto head = run_command(git + " rev-parse --short=12 HEAD 2>/dev/null");
  if (head.exit_code != 0 || tandem::testing::tandem_binary() == "tandem")
    GTEST_SKIP() << "not a build from a git checkout";
  const bool dirty = !run_command(git + " status --porcelain --untracked-files=no").output.empty();
  const std::string revision = head.output.substr(0, head.output.find('\n')) + (dirty ? "-dirty" : "");
  const auto version = run_command(tandem_cmd("--version"));
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find(" (" + revision + ")\n"), std::string::npos) << version.output << "expected " << revision;
}

TEST(Cli, CheckPrintsTheResolvedDeckWithOverrides) {
  TempDir dir;
  tandem::testing::write_text(dir / "x.deck", "[run]\nsteps = 7\n");
  const auto result = run_command(tandem_cmd("--check " + (dir / "x.deck").string() + " --run.seed=99"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("steps = 7"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("seed = 99"), std::string::npos) << result.output;
}

TEST(Cli, BadDeckExitsTwoWithFileLineAndKey) {
  TempDir dir;
  const auto deck = dir / "bad.deck";
  tandem::testing::write_text(deck, "[run]\nsteps = 3\nstpes = 4\n");
  for (const std::string& mode : {"--check ", ""}) {
    const auto result = run_command(tandem_cmd(mode + deck.string()));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(deck.string() + ":3"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("run.steps"), std::string::npos) << result.output;  // the suggestion
  }
  const auto missing = run_command(tandem_cmd("--check " + (dir / "none.deck").string()));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
}

TEST(Cli, RunWritesLogRunFileAndCheckpoints) {
  TempDir dir;
  const auto result = run_command(tandem_cmd(short_run(dir, "a", 4)));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto folder = dir.path() / "a";
  EXPECT_NE(result.output.find("tandem setup"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Loop time of"), std::string::npos) << result.output;
  EXPECT_TRUE(std::filesystem::exists(folder / "tandem.log"));
  EXPECT_TRUE(std::filesystem::exists(folder / "ckpt_00000002.h5"));
  EXPECT_TRUE(std::filesystem::exists(folder / "ckpt_00000004.h5"));
  const RunFile run = RunFile::open(folder / kRunFileName);
  EXPECT_EQ(run.steps(), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(run.info().ranks, 1);
  EXPECT_NE(run.info().deck_text.find("steps = 4"), std::string::npos);
}

// The run file keeps the samples of a GRPO step; the trainer recomputes the engine's
// log-probs of the sampled tokens (on-policy: the importance ratio starts at 1).
TEST(Cli, SamplesCarryRolloutAndTrainLogprobs) {
  TempDir dir;
  const auto result = run_command(tandem_cmd(short_run(dir, "s", 4) + " --run.samples-every=4"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const RunFile run = RunFile::open(dir.path() / "s" / kRunFileName);
  ASSERT_EQ(run.sample_steps(), (std::vector<int64_t>{4}));
  const auto samples = run.samples(4);
  ASSERT_EQ(samples.size(), 16u * 8u);
  size_t tokens = 0;
  for (const auto& sample : samples) {
    ASSERT_EQ(sample.train_logp.size(), sample.completion_tokens.size());
    for (size_t j = 0; j < sample.completion_tokens.size(); ++j, ++tokens)
      EXPECT_NEAR(sample.train_logp[j], sample.rollout_logp[j], 1e-5) << sample.prompt_text << sample.completion_text;
    EXPECT_FALSE(sample.prompt_text.empty());
  }
  EXPECT_GT(tokens, samples.size());
}

// The largest difference between the trainer's and the rollout's log-probs of the samples
// that the run in `folder` kept at `step`.
static double largest_logp_gap(const std::filesystem::path& folder, int64_t step) {
  const RunFile run = RunFile::open(folder / kRunFileName);
  double worst = 0;
  for (const auto& sample : run.samples(step))
    for (size_t j = 0; j < sample.completion_tokens.size(); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(sample.train_logp[j]) - sample.rollout_logp[j]));
  return worst;
}

// A 4-step run of `name` with the extra `flags`, which must go through and name
// `setup_line` in its set-up table; returns largest_logp_gap of its step-4 samples.
static double fp8_run_gap(TempDir& dir, const std::string& name, const std::string& flags,
                          const std::string& setup_line) {
  const auto result = run_command(tandem_cmd(short_run(dir, name, 4) + " --run.samples-every=4 " + flags));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(setup_line), std::string::npos) << result.output;
  const double worst = largest_logp_gap(dir.path() / name, 4);
  std::printf("largest rollout/train log-prob difference: %.3g\n", worst);
  return worst;
}

// rollout.kv-cache-dtype = fp8 reaches the engine: the set-up table names the codes, and
// the samples' rollout log-probs (from keys and values rounded to E4M3) differ from the
// trainer's by more than an FP32 cache's 1e-5, yet little; a dtype it does not know is a
// deck error.
TEST(Cli, Fp8KvCacheSamplesFromTheCodes) {
  TempDir dir;
  const double worst = fp8_run_gap(dir, "fp8", "--rollout.kv-cache-dtype=fp8", "FP8 E4M3 with scales");
  EXPECT_GT(worst, 1e-4);
  EXPECT_LT(worst, 0.25);
  const auto bad = run_command(tandem_cmd("--check --rollout.kv-cache-dtype=int8"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("rollout.kv-cache-dtype"), std::string::npos) << bad.output;
}

// The engine's projections in FP8 (the codes made again from the trained weights at each
// step's rollout): the run goes through, and the rollout log-probs move away from the
// trainer's by the rounding (0.035 on the default deck's model), not by stale codes (3.3
// when the codes of step 1 stay).
TEST(Cli, Fp8WeightsSampleFromCodedProjections) {
  TempDir dir;
  const double worst = fp8_run_gap(dir, "fp8w", "--rollout.weight-dtype=fp8", "of FP8 projections beside it");
  EXPECT_GT(worst, 1e-3);
  EXPECT_LT(worst, 0.5);
}

static void expect_same_tensors(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& info : a.tensors()) {
    std::vector<float> x(64 * 1024), y(64 * 1024);
    int64_t n = 1;
    for (auto extent : info.shape) n *= extent;
    x.resize(n), y.resize(n);
    a.read_tensor(info.name, Tensor::view(x.data(), info.dtype, Device::CPU, info.shape));
    b.read_tensor(info.name, Tensor::view(y.data(), info.dtype, Device::CPU, info.shape));
    EXPECT_EQ(x, y) << info.name;
  }
}

// Runs the same deck uninterrupted and as two jobs (4 steps, then a restart for the last
// 2); the restart must be bit-exact: same metrics, same final checkpoint. Returns the
// prompt groups each step drew.
static std::vector<double> expect_restart_is_bit_exact(const std::string& extra) {
  TempDir dir;
  EXPECT_EQ(run_command(tandem_cmd(short_run(dir, "whole", 6) + extra)).exit_code, 0);
  EXPECT_EQ(run_command(tandem_cmd(short_run(dir, "split", 6) + extra + " --run.steps-per-job=4")).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "split" / "ckpt_00000006.h5"));
  const auto resumed = run_command(tandem_cmd(short_run(dir, "split", 6) + extra));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("ckpt_00000004.h5 at step 4"), std::string::npos) << resumed.output;

  const RunFile whole = RunFile::open(dir.path() / "whole" / kRunFileName);
  const RunFile split = RunFile::open(dir.path() / "split" / kRunFileName);
  EXPECT_EQ(split.steps(), whole.steps());
  // Same rewards and losses with and without the interruption: the restart is bit-exact.
  for (const char* metric : {"data_cursor", "sampling/drawn_groups", "reward_mean", "accuracy", "loss", "grad_norm"})
    EXPECT_EQ(split.metric(metric), whole.metric(metric)) << metric;
  const Checkpoint a = Checkpoint::open(dir.path() / "whole" / "ckpt_00000006.h5");
  const Checkpoint b = Checkpoint::open(dir.path() / "split" / "ckpt_00000006.h5");
  EXPECT_EQ(a.rng_states(), b.rng_states());
  EXPECT_EQ(a.data_cursor(), b.data_cursor());
  expect_same_tensors(a, b);
  // The cursor counts the prompts drawn so far: no step reuses another's prompts.
  const std::vector<double> drawn = whole.metric("sampling/drawn_groups"), cursor = whole.metric("data_cursor");
  double sum = 0;
  for (size_t i = 0; i < drawn.size(); ++i) EXPECT_EQ(cursor[i], sum += drawn[i]) << "step " << i + 1;
  return drawn;
}

TEST(Cli, RestartAutoResumesAndMatchesAnUninterruptedRun) { expect_restart_is_bit_exact(""); }
// The checkpoints above are written in the background (run.checkpoint-async's default);
// the synchronous writer must restart as exactly.
TEST(Cli, RestartFromSynchronousCheckpointsIsBitExact) { expect_restart_is_bit_exact(" --run.checkpoint-async=false"); }
// The KL term's frozen reference is the initial policy, which a restart draws again.
TEST(Cli, RestartWithAKlTermIsBitExact) { expect_restart_is_bit_exact(" --grpo.kl-coef=0.05"); }

// Dynamic sampling draws a varying number of prompts per step: the prompt cursor in the
// checkpoint is what lets the restart draw the same ones.
TEST(Cli, RestartWithDynamicSamplingIsBitExact) {
  // Groups of 2 often score alike, so the GRPO steps (4 to 6) draw extra rounds.
  const std::vector<double> drawn =
      expect_restart_is_bit_exact(" --grpo.dynamic-sampling=true --grpo.dynamic-sampling-rounds=3 --grpo.group-size=2");
  ASSERT_EQ(drawn.size(), 6u);
  EXPECT_GT(*std::max_element(drawn.begin() + 3, drawn.end()), 16.0);
}

TEST(Cli, TwoRanksRunUnderMpirun) {
  TempDir dir;
  const auto result = run_command(mpirun(2) + tandem_cmd(short_run(dir, "two", 2)));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("on 2 ranks"), std::string::npos) << result.output;
  const Checkpoint checkpoint = Checkpoint::open(dir.path() / "two" / "ckpt_00000002.h5");
  EXPECT_EQ(checkpoint.rng_states().size(), 2u);
  EXPECT_NE(checkpoint.rng_states()[0], checkpoint.rng_states()[1]);
}

// The embedded default's recipe, shortened: the supervised warm-up teaches the format,
// then GRPO alone must raise the reward well above where the warm-up left it. One CPU
// thread: this model is too small for a second to shorten a step, and its OpenMP spin-wait
// doubled the CPU time a step costs on a loaded 2-core CI machine (the run is the same:
// every reward and loss equal to the 2-thread run's).
static void expect_grpo_raises_the_reward(const std::string& extra, size_t steps, size_t sft_steps) {
  TempDir dir;
  const auto result = run_command(tandem_cmd("--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() +
                                             " --run.name=learn --run.steps=" + std::to_string(steps) + " --sft.steps=" +
                                             std::to_string(sft_steps) + " --run.checkpoint-every=0" + extra));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const RunFile run = RunFile::open(dir.path() / "learn" / kRunFileName);
  const std::vector<double> reward = run.metric("reward_mean"), sft = run.metric("phase_sft");
  ASSERT_EQ(reward.size(), steps);
  EXPECT_EQ(sft[sft_steps - 1], 1.0);
  EXPECT_EQ(sft[sft_steps], 0.0);
  auto mean = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += reward[i];
    return sum / static_cast<double>(to - from);
  };
  const double start = mean(0, 5), after_sft = mean(sft_steps - 10, sft_steps), end = mean(steps - 20, steps);
  EXPECT_LT(start, 0.1);
  EXPECT_GT(end, after_sft + 0.08) << "warm-up left " << after_sft << ", GRPO reached " << end;
}

TEST(Cli, GrpoPhaseRaisesTheReward) { expect_grpo_raises_the_reward("", 260, 60); }

// Muon with the default learning rates (sft.lr 3e-3, grpo.lr 2e-3): Moonlight's scale
// of the update lets AdamW's rates carry over. It learns faster (the 260-step recipe:
// reward 0.54 after the 60 warm-up steps, ~0.9 at the end), so a shorter run does.
TEST(Cli, MuonLearnsTheEmbeddedTaskAtAdamWsLearningRates) {
  expect_grpo_raises_the_reward(" --optimizer.name=muon", 130, 30);
}

// Muon's momentum is checkpoint state like AdamW's moments.
TEST(Cli, RestartWithMuonIsBitExact) { expect_restart_is_bit_exact(" --optimizer.name=muon"); }

// Every optimizer x state combination restarts bit-exact (AdamW on the device above).
TEST(Cli, RestartWithStateOnDiskIsBitExact) { expect_restart_is_bit_exact(" --optimizer.state=disk"); }
// The state file's msync in the step, after the synchronous write, rather than on the writer's thread.
TEST(Cli, RestartWithStateOnDiskAndSynchronousCheckpointsIsBitExact) {
  expect_restart_is_bit_exact(" --optimizer.state=disk --run.checkpoint-async=false");
}
TEST(Cli, RestartWithMuonAndStateOnDiskIsBitExact) {
  expect_restart_is_bit_exact(" --optimizer.name=muon --optimizer.state=disk");
}
// The state in host memory, streamed in chunks of 4 KiB (hundreds of chunks per step).
TEST(Cli, RestartWithStateOnHostIsBitExact) {
  expect_restart_is_bit_exact(" --optimizer.state=host --optimizer.chunk-bytes=4KiB");
}
// Muon's chunks hold whole matrices: a slot of 4 KiB grows to the largest one.
TEST(Cli, RestartWithMuonAndStateOnHostIsBitExact) {
  expect_restart_is_bit_exact(" --optimizer.name=muon --optimizer.state=host --optimizer.chunk-bytes=4KiB");
}

// optimizer.state = disk: the same run as with the state beside the weights, bit for bit;
// the state file is gone at the end and the run file has the resident-memory figures.
// The state streamed in chunks of 4 KiB, so tensors are cut across chunks.
TEST(Cli, StateOnHostGivesTheSameRunBitForBit) {
  TempDir dir;
  ASSERT_EQ(run_command(tandem_cmd(short_run(dir, "device", 3))).exit_code, 0);
  const auto host = run_command(tandem_cmd(short_run(dir, "host", 3) + " --optimizer.state=host --optimizer.chunk-bytes=4KiB"));
  ASSERT_EQ(host.exit_code, 0) << host.output;
  const RunFile a = RunFile::open(dir.path() / "device" / kRunFileName);
  const RunFile b = RunFile::open(dir.path() / "host" / kRunFileName);
  for (const char* metric : {"reward_mean", "loss", "grad_norm"}) EXPECT_EQ(a.metric(metric), b.metric(metric)) << metric;
  expect_same_tensors(Checkpoint::open(dir.path() / "device" / "ckpt_00000003.h5"),
                      Checkpoint::open(dir.path() / "host" / "ckpt_00000003.h5"));
  // Offloading the trainer copies no state that lives on the host: the pool moves less.
  EXPECT_LT(b.metric("handoff/bytes").back(), a.metric("handoff/bytes").back());
}

TEST(Cli, StateOnDiskGivesTheSameRunBitForBit) {
  TempDir dir;
  ASSERT_EQ(run_command(tandem_cmd(short_run(dir, "device", 4) + " --optimizer.name=muon")).exit_code, 0);
  const auto disk = run_command(tandem_cmd(short_run(dir, "disk", 4) +
                                           " --optimizer.name=muon --optimizer.state=disk --optimizer.chunk-bytes=4KiB"));
  ASSERT_EQ(disk.exit_code, 0) << disk.output;
  const RunFile a = RunFile::open(dir.path() / "device" / kRunFileName);
  const RunFile b = RunFile::open(dir.path() / "disk" / kRunFileName);
  for (const char* metric : {"reward_mean", "loss", "grad_norm"}) EXPECT_EQ(a.metric(metric), b.metric(metric)) << metric;
  expect_same_tensors(Checkpoint::open(dir.path() / "device" / "ckpt_00000004.h5"),
                      Checkpoint::open(dir.path() / "disk" / "ckpt_00000004.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "disk" / "disk.rank0.optimizer-state"));
  EXPECT_GT(b.metric("memory/rss_file").back(), 0);
  EXPECT_GT(b.metric("memory/rss_anon").back(), 0);
  // The state file's msync follows each checkpoint's write, on the writer's thread: its
  // time is recorded with the write's, at the step that write ended.
  const std::vector<double> msync = b.metric("checkpoint/state_msync_seconds"), write = b.metric("checkpoint/write_seconds");
  ASSERT_EQ(msync.size(), 4u);
  ASSERT_EQ(write.size(), 4u);
  int recorded = 0;
  for (size_t row = 0; row < msync.size(); ++row) {
    EXPECT_EQ(std::isnan(msync[row]), std::isnan(write[row])) << "step " << row + 1;
    if (std::isnan(msync[row])) continue;
    ++recorded;
    EXPECT_GE(msync[row], 0.0) << "step " << row + 1;
  }
  EXPECT_GE(recorded, 1);  // step 2's checkpoint ended at step 3 or 4, step 4's after the last row
}

// A file-size limit (or a full disk) stops the job at start-up with exit code 2, naming
// the state file and its bytes: never a SIGBUS (or SIGXFSZ) later. The limit, 16 MiB,
// leaves room for MPI's own files; the state of this model is 51 MB.
TEST(Cli, AStateFileThatCannotBeSizedStopsTheStartNamingPathAndBytes) {
  TempDir dir;
  const auto result = run_command("ulimit -f 16384; exec " +
                                  tandem_cmd(short_run(dir, "full", 2) +
                                             " --optimizer.state=disk --model.hidden=512 --model.intermediate=2048"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("optimizer.state-path"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find((dir.path() / "full" / "full.rank0.optimizer-state").string() + " ("),
            std::string::npos) << result.output;
  EXPECT_NE(result.output.find(" bytes): cannot reserve the space (posix_fallocate): File too large"), std::string::npos)
      << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "full" / "full.rank0.optimizer-state"));
}

// A checkpoint names the optimizer state it holds, so resuming under another optimizer
// stops on the first tensor it lacks.
TEST(Cli, CheckpointNamesTheOptimizerState) {
  TempDir dir;
  ASSERT_EQ(run_command(tandem_cmd(short_run(dir, "m", 2) + " --optimizer.name=muon")).exit_code, 0);
  const Checkpoint checkpoint = Checkpoint::open(dir.path() / "m" / "ckpt_00000002.h5");
  EXPECT_TRUE(checkpoint.has_tensor("muon.momentum.model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(checkpoint.has_tensor("adamw.exp_avg.model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(checkpoint.has_tensor("adamw.exp_avg_sq.model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(checkpoint.has_tensor("adamw.exp_avg_sq.model.embed_tokens.weight"));
  const auto resumed = run_command(tandem_cmd(short_run(dir, "m", 4)));
  EXPECT_NE(resumed.exit_code, 0);
  EXPECT_NE(resumed.output.find("'adamw.exp_avg.model.layers.0."), std::string::npos) << resumed.output;
}

// A micro-batch holds whole sequences: one smaller than a sequence (prompt + completion)
// is a deck error naming the minimum, on --check and before a run allocates anything. A
// micro-batch of that minimum runs, though it holds fewer sequences than the step's 128.
TEST(Cli, MicroBatchBelowOneSequenceExitsTwoNamingTheMinimum) {
  TempDir dir;
  const auto deck = dir / "micro.deck";
  tandem::testing::write_text(deck, "[grpo]\nmax-new-tokens = 6\n\n[train]\nmicro-batch-tokens = 8\n");
  int64_t minimum = 0;
  for (const std::string& mode : {"--check ", ""}) {
    const auto result = run_command(tandem_cmd(mode + deck.string() + " " + short_run(dir, "m", 4)));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    const std::string expected = deck.string() + ":5: key 'train.micro-batch-tokens': 8 tokens do not hold one sequence: at least ";
    const size_t at = result.output.find(expected);
    ASSERT_NE(at, std::string::npos) << result.output;
    minimum = std::stoll(result.output.substr(at + expected.size()));
    EXPECT_NE(result.output.find("+ grpo.max-new-tokens = 6)"), std::string::npos) << result.output;
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "m")) << "refused before the run started";
  }
  EXPECT_GT(minimum, 6);
  EXPECT_EQ(run_command(tandem_cmd("--check " + deck.string() + " --train.micro-batch-tokens=" + std::to_string(minimum))).exit_code, 0);
  const auto run = run_command(tandem_cmd(deck.string() + " " + short_run(dir, "m", 2) + " --sft.steps=1 --train.micro-batch-tokens=" +
                                          std::to_string(minimum)));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST(Cli, BadBetasExitTwoNamingTheKey) {
  const auto result = run_command(tandem_cmd("--check --optimizer.betas=0.9"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("optimizer.betas"), std::string::npos) << result.output;
}

// Data parallelism: N ranks with P/N prompts each take the same steps as one rank with P
// prompts (the same samples, the same global loss), up to the order of FP32 sums.
TEST(Cli, RanksSplitTheBatchWithoutChangingTheRun) {
  TempDir dir;
  auto run = [&](int np, const std::string& name) {
    const int prompts = 8 / np;
    const std::string args = "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() +
                             " --run.name=" + name + " --run.steps=4 --sft.steps=2 --run.checkpoint-every=0" +
                             " --task.prompts-per-step=" + std::to_string(prompts) +
                             " --grpo.loss-aggregation=global-token-sum";
    const auto result = run_command((np > 1 ? mpirun(np) : std::string()) + tandem_cmd(args));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return RunFile::open(dir.path() / name / kRunFileName);
  };
  const RunFile one = run(1, "one");
  for (int np : {2, 4}) {
    SCOPED_TRACE(std::to_string(np) + " ranks");
    const RunFile many = run(np, "np" + std::to_string(np));
    // The same samples: their statistics agree up to the rounding of a mean of means.
    for (const char* metric : {"reward_mean", "accuracy", "response_length"}) {
      const auto a = one.metric(metric), b = many.metric(metric);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-12) << metric << " at step " << i + 1;
    }
    const auto a = one.metric("loss"), b = many.metric("loss");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * (1 + std::fabs(a[i]))) << "loss at step " << i + 1;
  }
}

// With a KL coefficient the trainer runs the frozen initial policy as the reference, and
// the step records the KL and the policy's entropy.
TEST(Cli, KlToTheInitialPolicyAndEntropyAreMeasured) {
  TempDir dir;
  const auto result =
      run_command(tandem_cmd(short_run(dir, "kl", 5) + " --grpo.kl-coef=0.05 --grpo.entropy-coef=0.01"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const RunFile run = RunFile::open(dir.path() / "kl" / kRunFileName);
  const auto kl = run.metric("kl"), entropy = run.metric("entropy");
  ASSERT_EQ(kl.size(), 5u);
  EXPECT_GT(kl[3], 0.0);  // step 4: the first GRPO step, after 3 supervised steps moved the policy
  EXPECT_GT(entropy[3], 0.0);
}

TEST(Cli, CountdownDeckRuns) {
  TempDir dir;
  const auto result = run_command(tandem_cmd((tandem::testing::source_dir() / "inputs/countdown-tiny.deck").string() +
                                             " --run.output-dir=" + dir.path().string() +
                                             " --run.steps=3 --sft.steps=1 --model.layers=1"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("rl  3/3"), std::string::npos) << result.output;
  const RunFile run = RunFile::open(dir.path() / "countdown-tiny" / kRunFileName);
  EXPECT_EQ(run.steps().size(), 3u);
}

TEST(Cli, KvCacheCanBeAFractionOfFreeMemory) {
  TempDir dir;
  const auto result = run_command(tandem_cmd(short_run(dir, "kv", 1) + " --rollout.kv-cache-fraction=0.001"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("(0.001 of free memory)"), std::string::npos) << result.output;
  const auto bad = run_command(tandem_cmd("--check --rollout.kv-cache-fraction=2"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

// Dynamic sampling over ranks: every rank draws its slice of each round from one global
// prompt sequence and the kept groups are dealt out in prompt order, so 2 ranks with 2
// prompts each keep, draw and train on what 1 rank with 4 prompts does.
TEST(Cli, DynamicSamplingRanksReproduceOneRank) {
  TempDir dir;
  auto run = [&](int np, const std::string& name) {
    const std::string args = "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() +
                             " --run.name=" + name + " --run.steps=4 --sft.steps=2 --run.checkpoint-every=0" +
                             " --task.prompts-per-step=" + std::to_string(4 / np) +
                             " --grpo.loss-aggregation=global-token-sum --grpo.dynamic-sampling=true --grpo.group-size=2";
    const auto result = run_command((np > 1 ? mpirun(np) : std::string()) + tandem_cmd(args));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return RunFile::open(dir.path() / name / kRunFileName);
  };
  const RunFile one = run(1, "one"), two = run(2, "two");
  for (const char* metric : {"data_cursor", "sampling/drawn_groups", "sampling/kept_groups", "sampling/rounds",
                             "sampling/zero_spread_fraction"})
    EXPECT_EQ(two.metric(metric), one.metric(metric)) << metric;
  // Over-sampling happened: some GRPO step drew more than one round.
  const auto drawn = one.metric("sampling/drawn_groups");
  ASSERT_EQ(drawn.size(), 4u);
  EXPECT_GT(std::max(drawn[2], drawn[3]), 4.0);
  for (const char* metric : {"reward_mean", "accuracy", "response_length"}) {
    const auto a = one.metric(metric), b = two.metric(metric);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-12) << metric << " at step " << i + 1;
  }
  const auto a = one.metric("loss"), b = two.metric("loss");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * (1 + std::fabs(a[i]))) << "loss at step " << i + 1;
}

namespace {

const char* kPrompts =
    "{\"prompt\": \"What is 2+3?\", \"answer\": 5}\n"
    "{\"prompt\": \"What is 7-4?\", \"answer\": \"3\"}\n"
    "\n"
    "{\"prompt\": \"Name a prime.\", \"answer\": 7}\n";

std::string pretrained_run(const TempDir& dir, const std::string& name) {
  return "--world.device=cpu --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --model.path=" + (dir / "model").string() + " --task.name=jsonl --task.path=" + (dir / "prompts.jsonl").string() +
         " --task.reward=last-number";
}

}  // namespace

// A pretrained model folder and a JSONL task: the run starts from the folder's weights (the
// first rollout's log-probs are those of the safetensors model, and the KL to the frozen
// reference starts at zero), and its prompts go through the chat template.
TEST(Cli, PretrainedFolderAndJsonlPrompts) {
  TempDir dir;
  std::filesystem::create_directories(dir / "model");
  const ModelConfig config = tandem::testing::write_tiny_hf_model(dir / "model");
  tandem::testing::write_text(dir / "prompts.jsonl", kPrompts);
  const auto result = run_command(tandem_cmd(pretrained_run(dir, "hf") +
                                             " --run.steps=2 --sft.steps=0 --run.checkpoint-every=0 --run.samples-every=1"
                                             " --task.prompts-per-step=2 --grpo.group-size=2 --grpo.max-new-tokens=4"
                                             " --grpo.kl-coef=0.1 --grpo.lr=1e-3"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const RunFile run = RunFile::open(dir.path() / "hf" / kRunFileName);
  EXPECT_EQ(run.metric("kl").at(0), 0.0);

  tandem::testing::TinyModel model(config, {128, 1});
  load_hf_weights(dir / "model", model.params);
  const auto samples = run.samples(1);
  ASSERT_EQ(samples.size(), 4u);
  for (const SampleRecord& sample : samples) {
    EXPECT_EQ(sample.prompt_text.rfind("<|im_start|>user\n", 0), 0u) << sample.prompt_text;
    EXPECT_TRUE(sample.prompt_text.ends_with("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")) << sample.prompt_text;
    EXPECT_EQ(sample.prompt_tokens.front(), tandem::testing::kTinyImStart);
    std::vector<int32_t> sequence = sample.prompt_tokens;
    sequence.insert(sequence.end(), sample.completion_tokens.begin(), sample.completion_tokens.end() - 1);
    const std::vector<int32_t> cu = {0, static_cast<int32_t>(sequence.size())};
    const Tensor logits = model.transformer.forward(model.params, model.acts, sequence, cu);
    for (size_t j = 0; j < sample.completion_tokens.size(); ++j) {
      const float* row = logits.ptr<float>() + (sample.prompt_tokens.size() - 1 + j) * config.vocab;
      EXPECT_NEAR(sample.rollout_logp[j], tandem::testing::reference_logprob(row, config.vocab, sample.completion_tokens[j], 1.0), 1e-4);
    }
  }
}

TEST(Cli, JsonlPromptFileErrorsAreDeckErrors) {
  TempDir dir;
  std::filesystem::create_directories(dir / "model");
  tandem::testing::write_tiny_hf_model(dir / "model");
  tandem::testing::write_text(dir / "prompts.jsonl", std::string(kPrompts) + "{\"prompt\": \"no answer\"}\n");
  for (const std::string& mode : {"--check ", ""}) {
    const auto bad = run_command(tandem_cmd(mode + pretrained_run(dir, "bad")));
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    EXPECT_NE(bad.output.find((dir / "prompts.jsonl").string() + ":5: missing key \"answer\""), std::string::npos) << bad.output;
  }
  const auto no_model = run_command(tandem_cmd("--check --task.name=jsonl --task.path=" + (dir / "prompts.jsonl").string()));
  EXPECT_EQ(no_model.exit_code, 2) << no_model.output;
  EXPECT_NE(no_model.output.find("set model.path"), std::string::npos) << no_model.output;
  // The model folder is read at start-up: a missing file there is a deck error too.
  tandem::testing::write_text(dir / "prompts.jsonl", kPrompts);
  std::filesystem::remove(dir / "model" / "tokenizer.json");
  const auto incomplete = run_command(tandem_cmd(pretrained_run(dir, "incomplete")));
  EXPECT_EQ(incomplete.exit_code, 2) << incomplete.output;
  EXPECT_NE(incomplete.output.find("key 'model.path': missing file " + (dir / "model" / "tokenizer.json").string()),
            std::string::npos)
      << incomplete.output;
}

// A pretrained model's prompts go through its chat template, read at start-up: there, on
// every rank together, a micro-batch below one sequence stops the job with exit 2.
TEST(Cli, MicroBatchBelowAPretrainedSequenceStopsTheStart) {
  TempDir dir;
  std::filesystem::create_directories(dir / "model");
  tandem::testing::write_tiny_hf_model(dir / "model");
  tandem::testing::write_text(dir / "prompts.jsonl", kPrompts);
  const std::string small = " --train.micro-batch-tokens=8 --grpo.max-new-tokens=4";
  EXPECT_EQ(run_command(tandem_cmd("--check " + pretrained_run(dir, "small") + small)).exit_code, 0);
  const auto result = run_command(mpirun(2) + tandem_cmd(pretrained_run(dir, "small") + small));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("command line: key 'train.micro-batch-tokens': 8 tokens do not hold one sequence: at least "),
            std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("rank 1:"), std::string::npos) << "every rank alike, said once\n" << result.output;
}

// The real-model deck checks as shipped (--check leaves the model folder alone: it may be
// visible to the compute nodes only); a run names the placeholder folder as missing; with
// its path line edited to a model folder it runs.
TEST(Cli, Qwen3CountdownDeckChecksAndNeedsItsModelFolderToRun) {
  TempDir dir;
  const std::filesystem::path shipped = tandem::testing::source_dir() / "inputs/qwen3-0.6b-countdown.deck";
  const auto checked = run_command(tandem_cmd("--check " + shipped.string()));
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  for (const char* line : {"dynamic-sampling = true", "name = countdown", "group-size = 8", "max-new-tokens = 512",
                           "lr = 1e-06", "kl-coef = 0", "prompts-per-step = 32", "dtype = bf16", "device = cuda"})
    EXPECT_NE(checked.output.find(line), std::string::npos) << line << "\n" << checked.output;
  const std::string small = " --world.device=cpu --run.output-dir=" + dir.path().string() +
                            " --run.steps=1 --task.prompts-per-step=1 --grpo.group-size=2 --grpo.max-new-tokens=2";
  const auto placeholder = run_command(tandem_cmd(shipped.string() + small));
  EXPECT_EQ(placeholder.exit_code, 2) << placeholder.output;
  EXPECT_NE(placeholder.output.find("key 'model.path': '/path/to/Qwen3-0.6B' is not a folder"), std::string::npos)
      << placeholder.output;

  std::filesystem::create_directories(dir / "model");
  tandem::testing::write_tiny_hf_model(dir / "model");
  std::string text = tandem::testing::read_text(shipped);
  const std::string line = "path = /path/to/Qwen3-0.6B";
  ASSERT_NE(text.find(line), std::string::npos);
  text.replace(text.find(line), line.size(), "path = " + (dir / "model").string());
  tandem::testing::write_text(dir / "edited.deck", text);
  const auto ran = run_command(tandem_cmd((dir / "edited.deck").string() + small));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("rl  1/1"), std::string::npos) << ran.output;
}
