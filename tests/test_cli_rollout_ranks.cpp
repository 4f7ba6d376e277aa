// world.rollout-ranks as the user runs it, under mpirun (-np 3, 4 and 5): T trainer ranks
// and K rollout ranks take the same steps as T colocated ranks (the seeds follow the
// prompts, not the rank that samples them), a split run resumes, a signal to a rollout
// rank stops every rank at one step and a stopped one is named, a failure of the trainers
// ends the engines too, an engine's error (in a round or at start-up) ends every rank with
// its message, and a split that leaves no trainer is a deck error. Then
// rollout.max-staleness = 1: the round sampled ahead, its weights, restarts and stops.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "io/run_file.h"
#include "support.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

// `timeout` keeps a hung job from hanging the test; without it, mpirun's children are the ranks.
std::string mpirun(int np, bool timeout = true) {
  return std::string("env OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ") +
         (timeout ? "timeout 120 " : "") + "mpirun --oversubscribe " +
         (getuid() == 0 ? "--allow-run-as-root " : "") + "-np " + std::to_string(np) + " " + tandem::testing::tandem_binary() +
         " ";
}

// 2 prompts of 2 samples per trainer, dynamic sampling (so some steps draw extra rounds).
std::string run_args(const TempDir& dir, const std::string& name, int rollout_ranks, int prompts = 2) {
  return "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --run.steps=5 --sft.steps=2 --run.checkpoint-every=0 --task.prompts-per-step=" + std::to_string(prompts) +
         " --grpo.group-size=2 --grpo.dynamic-sampling=true --grpo.loss-aggregation=global-token-sum" +
         (rollout_ranks > 0 ? " --sync.transport=broadcast --world.rollout-ranks=" + std::to_string(rollout_ranks) : "");
}

// Over-sampling: rounds of `per_prompt` times the batch's prompts.
std::string over_sampling(int prompts, int per_prompt) {
  return " --grpo.over-sampling-groups=" + std::to_string(prompts * per_prompt);
}

// `trainers` trainer ranks with 1, 2 or 4 rollout ranks against as many colocated ranks;
// 4 engines get fewer groups than there are of them in a round of 2 prompts.
// The process of mpirun's children that Open MPI numbers `rank`; 0 if none.
int process_of_rank(const std::vector<int>& processes, int rank) {
  for (const int pid : processes)
    if (tandem::testing::read_text("/proc/" + std::to_string(pid) + "/environ")
            .find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos)
      return pid;
  return 0;
}

void expect_split_runs_reproduce_colocated(int trainers, const std::vector<int>& engine_counts, const std::string& extra = "") {
  TempDir dir;
  const auto colocated = run_command(mpirun(trainers) + run_args(dir, "colocated", 0) + extra);
  ASSERT_EQ(colocated.exit_code, 0) << colocated.output;
  for (int engines : engine_counts) {
    SCOPED_TRACE(std::to_string(trainers) + " trainer ranks, " + std::to_string(engines) + " rollout ranks");
    const std::string name = "split" + std::to_string(engines);
    const auto split = run_command(mpirun(trainers + engines) + run_args(dir, name, engines) + extra);
    ASSERT_EQ(split.exit_code, 0) << split.output;
    EXPECT_NE(split.output.find("cpu (1 threads), rollout"), std::string::npos) << split.output;
    EXPECT_NE(split.output.find("cpu (1 threads), trainer"), std::string::npos) << split.output;
    // The setup table describes the split: no KV cache or offload beside the trainers.
    EXPECT_NE(split.output.find("each rollout rank: weights + KV cache"), std::string::npos) << split.output;
    EXPECT_EQ(split.output.find("| offload"), std::string::npos) << split.output;
    tandem::testing::expect_same_metrics(dir.path() / "colocated", dir.path() / name);
    const RunFile a = RunFile::open(dir.path() / "colocated" / kRunFileName), b = RunFile::open(dir.path() / name / kRunFileName);
    for (const char* metric : {"sampling/drawn_groups", "sampling/kept_groups", "sampling/zero_spread_fraction", "format_rate",
                               "reward_std", "kl", "rollout/graph_setup_seconds"})
      EXPECT_EQ(b.metric(metric), a.metric(metric)) << metric;
    const auto drawn = a.metric("sampling/drawn_groups");
    EXPECT_GT(*std::max_element(drawn.begin() + 2, drawn.end()), 2.0 * trainers);  // an extra round was drawn
    EXPECT_GT(b.metric("sync/bytes").back(), 0.0);
  }
}

// Runs `args` at -np 3 and sends SIGTERM to job rank `rank` once step 2 has ended; the
// job must stop cleanly. `output` gets the job's output.
void stop_at_sigterm(const TempDir& dir, const std::string& args, int rank, std::string& output) {
  tandem::testing::BackgroundCommand job(mpirun(3, false) + args, dir / "out");
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / "out", "[step 2]", 60)) << tandem::testing::read_text(dir / "out");
  const std::vector<int> ranks = job.children();
  ASSERT_EQ(ranks.size(), 3u);
  const int process = process_of_rank(ranks, rank);
  ASSERT_GT(process, 0);
  kill(process, SIGTERM);
  const int code = job.wait();
  output = tandem::testing::read_text(dir / "out");
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(output.find("SIGTERM received"), std::string::npos) << output;
  EXPECT_NE(output.find("stopped at step "), std::string::npos) << output;
}

}  // namespace

TEST(CliRolloutRanks, TwoTrainersWithOneOrTwoRolloutRanksReproduceTwoColocatedRanks) {
  expect_split_runs_reproduce_colocated(2, {1, 2});
}

TEST(CliRolloutRanks, OneTrainerWithFourRolloutRanksReproducesOneRank) { expect_split_runs_reproduce_colocated(1, {4}); }

// Rounds of three times the batch: a round ends once its first groups decide the batch,
// and the step counts those alone, whether colocated ranks sampled the rest or the
// rollout ranks aborted it.
TEST(CliRolloutRanks, WithOverSamplingTwoTrainersWithOneOrTwoRolloutRanksReproduceTwoColocatedRanks) {
  expect_split_runs_reproduce_colocated(2, {1, 2}, over_sampling(2, 3));
}

// Long generations: with 4096 token ids a random model rarely samples a stop id, so most
// completions run to max-new-tokens; lr 1e-9 keeps the model so.
const char* kLongGenerations = " --model.vocab=4096 --grpo.max-new-tokens=256 --sft.lr=1e-9";

// Each rollout rank's count in trainer rank 0's line `prefix`rank R: N, rank R: N (T in
// all); H left queued or running: every engine must have aborted some, none may hold
// any; returns T.
double expect_every_engine_aborted(const std::string& output, const std::string& prefix, int first_engine, int engines) {
  const size_t at = output.find(prefix);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no line " << prefix << "\n" << output;
    return 0;
  }
  std::istringstream counts(output.substr(at + prefix.size(), output.find('\n', at) - at - prefix.size()));
  double total = 0;
  for (int engine = 0; engine < engines; ++engine) {
    std::string rank, number;
    int64_t count = -1;
    counts >> rank >> number >> count;
    EXPECT_EQ(rank + " " + number, "rank " + std::to_string(first_engine + engine) + ":") << output;
    EXPECT_GT(count, 0) << "rollout rank " << first_engine + engine << " aborted nothing\n" << output;
    total += static_cast<double>(count);
    counts.ignore(1);  // the comma
  }
  std::string rest;
  std::getline(counts, rest);
  EXPECT_NE(rest.find("in all); 0 left queued or running"), std::string::npos) << rest;
  return total;
}

// One trainer, SFT steps (every group counts), a batch of one prompt per engine, rounds of
// 16 per engine. The engines are sized for their share of the batch (one group runs at a
// time), so when the first group of every engine is in, which decides the batch, each
// engine still has its other 15 groups queued or running: every engine aborts its own.
void expect_surplus_aborted_on_every_engine(int engines) {
  TempDir dir;
  const auto split = run_command(mpirun(1 + engines) + run_args(dir, "split", engines, engines) + over_sampling(engines, 16) +
                                 kLongGenerations + " --run.steps=2");
  ASSERT_EQ(split.exit_code, 0) << split.output;
  const std::vector<double> aborted = RunFile::open(dir.path() / "split" / kRunFileName).metric("rollout/aborted_requests");
  ASSERT_EQ(aborted.size(), 2u);
  for (const int step : {1, 2}) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::string line = "round of step " + std::to_string(step) + ": the first " + std::to_string(engines) + " of " +
                             std::to_string(16 * engines) + " groups decide the batch; requests aborted per rollout rank: ";
    EXPECT_EQ(aborted[step - 1], expect_every_engine_aborted(split.output, line, 1, engines));
  }
}

TEST(CliRolloutRanks, OverSamplingAbortsTheSurplusOnTheOneRolloutRank) { expect_surplus_aborted_on_every_engine(1); }
TEST(CliRolloutRanks, OverSamplingAbortsTheSurplusOnEachOfTwoRolloutRanks) { expect_surplus_aborted_on_every_engine(2); }
TEST(CliRolloutRanks, OverSamplingAbortsTheSurplusOnEachOfFourRolloutRanks) { expect_surplus_aborted_on_every_engine(4); }

// The engines hold no trainer state: a split run stopped after a job's steps resumes
// from the trainers' checkpoint, the engines from the weights trainer rank 0 sends them.
TEST(CliRolloutRanks, ASplitRunResumes) {
  TempDir dir;
  const auto whole = run_command(mpirun(3) + run_args(dir, "whole", 1));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string sliced = mpirun(3) + run_args(dir, "sliced", 1) + " --run.steps-per-job=3";
  const auto first = run_command(sliced);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("stopped at step 3"), std::string::npos) << first.output;
  const auto second = run_command(sliced);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  tandem::testing::expect_same_metrics(dir.path() / "whole", dir.path() / "sliced");
}

// SIGTERM to a rollout rank while the engines generate step 2 (1 prompt each, completions
// of up to 512 tokens): trainer rank 0 cuts the rollout on both engines, each aborts what
// it runs, the job exits 0 with step 1's checkpoint, and a restart redoes step 2 with the
// same seeds: the two jobs take the steps of one uninterrupted run.
TEST(CliRolloutRanks, ASignalDuringARolloutAbortsItOnEveryRolloutRankAndTheRunResumesBitExact) {
  TempDir dir;
  const std::string args = " --run.steps=2 " + std::string(kLongGenerations) + " --grpo.max-new-tokens=512";
  const auto whole = run_command(mpirun(3) + run_args(dir, "whole", 2) + args);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  tandem::testing::BackgroundCommand job(mpirun(3, false) + run_args(dir, "cut", 2) + args, dir / "out");
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / "out", "] info: sft 1/2", 60)) << tandem::testing::read_text(dir / "out");
  const int rollout_rank = process_of_rank(job.children(), 2);
  ASSERT_GT(rollout_rank, 0);
  kill(rollout_rank, SIGTERM);
  const int code = job.wait();
  const std::string output = tandem::testing::read_text(dir / "out");
  ASSERT_EQ(code, 0) << output;
  expect_every_engine_aborted(output, "the rollout of step 2 is cut (SIGTERM received on rollout rank 2); requests aborted per rollout rank: ", 1, 2);
  EXPECT_NE(output.find("stopped at step 1 of 2: SIGTERM received on rollout rank 2 during the rollout of step 2"), std::string::npos)
      << output;
  EXPECT_EQ(RunFile::open(dir.path() / "cut" / kRunFileName).steps().size(), 1u);
  const auto resumed = run_command(mpirun(3) + run_args(dir, "cut", 2) + args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  tandem::testing::expect_same_metrics(dir.path() / "whole", dir.path() / "cut");
}

TEST(CliRolloutRanks, ASignalToARolloutRankStopsEveryRankAtOneStep) {
  TempDir dir;
  std::string output;
  stop_at_sigterm(dir, run_args(dir, "signal", 1) + " --run.steps=1000", 2, output);
}

// A rollout rank that stops (SIGSTOP) is named by trainer rank 0, its neighbour on the
// link, within world.stall-timeout, and the job ends.
TEST(CliRolloutRanks, AStoppedRolloutRankIsReported) {
  TempDir dir;
  tandem::testing::BackgroundCommand job(
      mpirun(3, false) + run_args(dir, "stall", 1) + " --run.steps=1000 --world.stall-timeout=4s", dir / "out");
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / "out", "[step 2]", 60)) << tandem::testing::read_text(dir / "out");
  const int rollout_rank = process_of_rank(job.children(), 2);
  ASSERT_GT(rollout_rank, 0);
  kill(rollout_rank, SIGSTOP);
  const bool ended = job.ended_within(40);
  kill(rollout_rank, SIGCONT);
  const std::string output = tandem::testing::read_text(dir / "out");
  ASSERT_TRUE(ended) << output;
  EXPECT_EQ(job.wait(), 1) << output;
  EXPECT_NE(output.find("rank 2 has not reached "), std::string::npos) << output;
}

// lr = 1e30: the trainers stop with exit 3 at the first non-finite step, and the rollout
// rank, told so, leaves instead of waiting for its next order.
TEST(CliRolloutRanks, TheTrainersFailureEndsTheRolloutRanks) {
  TempDir dir;
  const auto result = run_command(mpirun(3) + run_args(dir, "nan", 1) + " --grpo.lr=1e30 --train.micro-batch-tokens=64");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("the gradients hold NaN or Inf"), std::string::npos) << result.output;
}

// Sequences longer than the KV cache holds: each rollout rank's engine refuses its share,
// and every rank leaves together (no MPI_Abort) with each rollout rank's message.
TEST(CliRolloutRanks, AnEngineErrorFailsEveryRankWithEachRolloutRanksMessage) {
  TempDir dir;
  const auto result =
      run_command(mpirun(4) + run_args(dir, "kv", 2) + " --rollout.kv-cache=16KiB --grpo.max-new-tokens=40");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  for (const char* rank : {"rollout rank 2: engine: request", "rollout rank 3: engine: request"})
    EXPECT_NE(result.output.find(rank), std::string::npos) << rank << "\n" << result.output;
  EXPECT_EQ(result.output.find("MPI_ABORT"), std::string::npos) << result.output;
}

TEST(CliRolloutRanks, ASplitMustLeaveATrainerAndUseTheBroadcastTransport) {
  TempDir dir;
  const auto all_engines = run_command(mpirun(2) + run_args(dir, "none", 2));
  EXPECT_EQ(all_engines.exit_code, 2) << all_engines.output;
  EXPECT_NE(all_engines.output.find("command line: key 'world.rollout-ranks': leaves no trainer among the job's 2 ranks"),
            std::string::npos)
      << all_engines.output;
  for (const std::string& args : {std::string("--world.rollout-ranks=1"), std::string("--sync.transport=broadcast")}) {
    const auto result = run_command(tandem::testing::tandem_binary() + " --check " + args);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("world.rollout-ranks = "), std::string::npos) << result.output;
  }
}

// rollout.max-staleness = 1 (2 trainers, 1 rollout rank): the engines sample step k+1
// with the weights of step k-1 while the trainers train step k.
namespace {

// Without SFT steps or dynamic sampling: each step draws one round, from the same prompts
// whatever the staleness, and its first sample on rank 0 is stored.
std::string staleness_args(const TempDir& dir, const std::string& name, int staleness, const std::string& lr) {
  return "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --run.steps=4 --sft.steps=0 --run.checkpoint-every=0 --run.samples-every=1 --task.prompts-per-step=2"
         " --grpo.group-size=2 --grpo.lr=" + lr + " --sync.transport=broadcast --world.rollout-ranks=1"
         " --rollout.max-staleness=" + std::to_string(staleness);
}

// Tokens and rollout log-probs of rank 0's samples of `step`.
std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> sampled(const RunFile& run, int64_t step) {
  std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> samples;
  for (const SampleRecord& record : run.samples(step)) samples.push_back({record.completion_tokens, record.rollout_logp});
  return samples;
}

}  // namespace

// With lr = 0 the weights never change, so the round sampled ahead is the round a
// staleness-0 run samples: every metric and sample is the same bit for bit (the prompt
// and seed plumbing), dynamic sampling's extra rounds included.
TEST(CliRolloutRanks, StalenessOneWithLearningRateZeroReproducesStalenessZero) {
  TempDir dir;
  const std::string dynamic = " --grpo.dynamic-sampling=true --run.steps=5";
  const auto fresh = run_command(mpirun(3) + staleness_args(dir, "fresh", 0, "0") + dynamic);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  const auto ahead = run_command(mpirun(3) + staleness_args(dir, "ahead", 1, "0") + dynamic);
  ASSERT_EQ(ahead.exit_code, 0) << ahead.output;
  tandem::testing::expect_same_metrics(dir.path() / "fresh", dir.path() / "ahead");
  const RunFile a = RunFile::open(dir.path() / "fresh" / kRunFileName), b = RunFile::open(dir.path() / "ahead" / kRunFileName);
  for (const char* metric :
       {"sampling/drawn_groups", "sampling/kept_groups", "reward_std", "ratio_mean", "ratio_max", "rollout/graph_setup_seconds"})
    EXPECT_EQ(b.metric(metric), a.metric(metric)) << metric;
  const auto drawn = a.metric("sampling/drawn_groups");
  EXPECT_GT(*std::max_element(drawn.begin(), drawn.end()), 4.0);  // an extra round was drawn
  for (int64_t step = 1; step <= 5; ++step) EXPECT_EQ(sampled(b, step), sampled(a, step)) << "step " << step;
  EXPECT_EQ(a.metric("rollout/staleness"), std::vector<double>(5, 0.0));
  // The share of each step's groups from its first round, the one sampled ahead (0 when
  // dynamic sampling kept only groups of the extra rounds, sampled afresh).
  const auto staleness = b.metric("rollout/staleness");
  const auto rounds = b.metric("sampling/rounds");
  EXPECT_EQ(staleness[0], 0.0);  // a job's first round is sampled afresh
  for (size_t step = 1; step < staleness.size(); ++step) {
    if (rounds[step] == 1) EXPECT_EQ(staleness[step], 1.0) << "step " << step + 1 << " trains on its first round alone";
    EXPECT_GE(staleness[step], 0.0);
    EXPECT_LE(staleness[step], 1.0);
  }
  EXPECT_GT(*std::max_element(staleness.begin(), staleness.end()), 0.0);
}

// With a real learning rate, step k+1's rollout log-probs come from the weights of step
// k-1: step 2's from the initial weights (as a run with lr = 0 samples it), step 3's
// from step 1's (as a staleness-0 run resumed after step 1 with lr = 0 samples it).
TEST(CliRolloutRanks, StalenessOneSamplesStepKPlusOneWithTheWeightsOfStepKMinusOne) {
  TempDir dir;
  const auto ahead = run_command(mpirun(3) + staleness_args(dir, "ahead", 1, "0.01"));
  ASSERT_EQ(ahead.exit_code, 0) << ahead.output;
  const auto initial = run_command(mpirun(3) + staleness_args(dir, "initial", 0, "0"));
  ASSERT_EQ(initial.exit_code, 0) << initial.output;
  const auto step_one = run_command(mpirun(3) + staleness_args(dir, "step1", 0, "0.01") + " --run.steps-per-job=1");
  ASSERT_EQ(step_one.exit_code, 0) << step_one.output;
  const auto frozen = run_command(mpirun(3) + staleness_args(dir, "step1", 0, "0"));
  ASSERT_EQ(frozen.exit_code, 0) << frozen.output;
  const RunFile a = RunFile::open(dir.path() / "ahead" / kRunFileName);
  const RunFile w0 = RunFile::open(dir.path() / "initial" / kRunFileName);
  const RunFile w1 = RunFile::open(dir.path() / "step1" / kRunFileName);
  EXPECT_EQ(sampled(a, 1), sampled(w0, 1));
  EXPECT_EQ(sampled(a, 2), sampled(w0, 2));
  EXPECT_EQ(sampled(a, 3), sampled(w1, 3));
  EXPECT_NE(sampled(w1, 3), sampled(w0, 3));  // the learning rate changed what the engines sample
  EXPECT_EQ(a.metric("rollout/staleness"), (std::vector<double>{0, 1, 1, 1}));
  // The importance ratio against the rollout log-probs: about 1 on-policy (step 1), off
  // it once the engines sample with weights a step older than the trainer's.
  const auto ratio = a.metric("ratio_max");
  EXPECT_LT(std::abs(ratio[0] - 1), 1e-4);
  EXPECT_GT(std::abs(ratio[1] - 1), 1e-3);
}

// A scheduled checkpoint's step orders nothing ahead: the next round is sampled with the
// checkpointed weights, so a run resumed from it takes the same steps bit for bit.
TEST(CliRolloutRanks, AStalenessOneRunResumedFromAScheduledCheckpointIsBitExact) {
  TempDir dir;
  const std::string args = " --run.steps=6 --run.checkpoint-every=3 --grpo.dynamic-sampling=true";
  const auto whole = run_command(mpirun(3) + staleness_args(dir, "whole", 1, "0.01") + args);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string sliced = mpirun(3) + staleness_args(dir, "sliced", 1, "0.01") + args + " --run.steps-per-job=3";
  const auto first = run_command(sliced);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto second = run_command(sliced);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("step 4's first round is sampled afresh"), std::string::npos) << second.output;
  tandem::testing::expect_same_metrics(dir.path() / "whole", dir.path() / "sliced");
  const RunFile a = RunFile::open(dir.path() / "whole" / kRunFileName), b = RunFile::open(dir.path() / "sliced" / kRunFileName);
  for (const char* metric : {"rollout/staleness", "ratio_mean", "sampling/drawn_groups"})
    EXPECT_EQ(b.metric(metric), a.metric(metric)) << metric;
  const auto staleness = a.metric("rollout/staleness");
  EXPECT_EQ(staleness[3], 0.0);  // step 4 follows the checkpoint of step 3
  EXPECT_GT(staleness[4], 0.0);
}

// A signal stops every rank at one step while the engines hold the next step's round:
// the round is dropped, and the resumed job samples its first round afresh.
TEST(CliRolloutRanks, ASignalStopsEveryRankWithARoundSampledAhead) {
  TempDir dir;
  const std::string args = staleness_args(dir, "signal", 1, "0.01") + " --run.samples-every=0 --run.steps=1000";
  std::string output;
  stop_at_sigterm(dir, args, 0, output);
  if (HasFatalFailure()) return;
  EXPECT_NE(output.find("the stop drops the round the rollout ranks sampled ahead"), std::string::npos) << output;
  const RunFile stopped = RunFile::open(dir.path() / "signal" / kRunFileName);
  const int64_t last = stopped.steps().back();
  const auto resumed = run_command(mpirun(3) + args + " --run.steps-per-job=2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step " + std::to_string(last + 1) + "'s first round is sampled afresh"), std::string::npos)
      << resumed.output;
  const auto staleness = RunFile::open(dir.path() / "signal" / kRunFileName).metric("rollout/staleness");
  ASSERT_EQ(staleness.size(), static_cast<size_t>(last + 2));
  EXPECT_EQ(staleness[last], 0.0);
  EXPECT_EQ(staleness[last + 1], 1.0);
}

// An engine that cannot be built (a KV cache of a few bytes) fails every rank together at
// start-up with each rollout rank's message, not through MPI_Abort.
TEST(CliRolloutRanks, AnEngineStartUpErrorFailsEveryRankWithEachRolloutRanksMessage) {
  TempDir dir;
  const auto result = run_command(mpirun(4) + run_args(dir, "start", 2) + " --rollout.kv-cache-fraction=1e-12");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  for (const char* rank : {"rollout rank 2: start-up: KV cache: ", "rollout rank 3: start-up: KV cache: "})
    EXPECT_NE(result.output.find(rank), std::string::npos) << rank << "\n" << result.output;
  EXPECT_NE(tandem::testing::read_text(dir.path() / "start" / "tandem.log").find("rollout rank 3: start-up"), std::string::npos);
  EXPECT_EQ(result.output.find("MPI_ABORT"), std::string::npos) << result.output;
}

TEST(CliRolloutRanks, StalenessNeedsRolloutRanks) {
  const auto result = run_command(tandem::testing::tandem_binary() + " --check --rollout.max-staleness=1");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("rollout.max-staleness = 1 samples the next step on rollout ranks"), std::string::npos)
      << result.output;
}
