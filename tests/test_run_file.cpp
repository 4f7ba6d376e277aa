#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/run_file.h"
#include "support.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

RunInfo two_rank_info() {
  RunInfo info;
  info.deck_text = "[model]\nname = tiny\n[train]\nsteps = 6\n";
  info.version = "0.1.0";
  info.git_revision = "abc123def456";
  info.ranks = 2;
  info.devices = {"cuda:0 NVIDIA H200 @ node1", "cuda:1 NVIDIA H200 @ node1"};
  info.started_at = "2025-01-02T03:04:05Z";
  return info;
}

// Metrics of step `step` as a run would log them; "kl" only from step 3 on.
MetricValues metrics_of(int64_t step) {
  MetricValues values = {{"reward_mean", 0.1 * step}, {"perf/tokens_per_s", 1000.0 + step}};
  if (step >= 3) values.push_back({"kl", 0.01 * step});
  return values;
}

// NaN-aware equality: the back-filled cells must match as NaN.
void expect_same_column(const std::vector<double>& actual, const std::vector<double>& expected,
                        const std::string& name) {
  ASSERT_EQ(actual.size(), expected.size()) << name;
  for (size_t row = 0; row < actual.size(); ++row) {
    if (std::isnan(expected[row]))
      EXPECT_TRUE(std::isnan(actual[row])) << name << " row " << row;
    else
      EXPECT_EQ(actual[row], expected[row]) << name << " row " << row;
  }
}

}  // namespace

TEST(RunFile, StoresWhatRanAndRefusesToOverwrite) {
  TempDir dir;
  const auto path = dir / kRunFileName;
  RunFile::create(path, two_rank_info());
  const RunInfo info = RunFile::open(path).info();
  EXPECT_EQ(info.deck_text, two_rank_info().deck_text);
  EXPECT_EQ(info.version, "0.1.0");
  EXPECT_EQ(info.git_revision, "abc123def456");
  EXPECT_EQ(info.ranks, 2);
  EXPECT_EQ(info.devices, two_rank_info().devices);
  EXPECT_EQ(info.started_at, "2025-01-02T03:04:05Z");
  EXPECT_THROW(RunFile::create(path, two_rank_info()), std::runtime_error);
  RunInfo inconsistent = two_rank_info();
  inconsistent.devices.pop_back();
  EXPECT_THROW(RunFile::create(dir / "other.h5", inconsistent), std::invalid_argument);
}

TEST(RunFile, MetricsTableGrowsAndBackFillsNaN) {
  TempDir dir;
  const RunFile run = RunFile::create(dir / kRunFileName, two_rank_info());
  EXPECT_TRUE(run.steps().empty());
  for (int64_t step = 1; step <= 4; ++step) run.append_metrics(step, metrics_of(step));
  run.append_metrics(5, {{"reward_mean", 0.5}});  // the others are missing at step 5
  EXPECT_EQ(run.steps(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(run.metric_names(), (std::vector<std::string>{"kl", "perf/tokens_per_s", "reward_mean"}));
  const double nan = std::nan("");
  expect_same_column(run.metric("reward_mean"), {0.1, 0.2, 0.1 * 3, 0.4, 0.5}, "reward_mean");
  expect_same_column(run.metric("kl"), {nan, nan, 0.03, 0.04, nan}, "kl");
  expect_same_column(run.metric("perf/tokens_per_s"), {1001, 1002, 1003, 1004, nan}, "perf/tokens_per_s");
}

TEST(RunFile, RefusesStepsOutOfOrderAndBadNames) {
  TempDir dir;
  const RunFile run = RunFile::create(dir / kRunFileName, two_rank_info());
  run.append_metrics(3, {{"loss", 1.0}});
  EXPECT_THROW(run.append_metrics(3, {{"loss", 1.0}}), std::invalid_argument);
  EXPECT_THROW(run.append_metrics(2, {{"loss", 1.0}}), std::invalid_argument);
  EXPECT_THROW(run.append_metrics(4, {{"loss", 1.0}, {"loss", 2.0}}), std::invalid_argument);
  EXPECT_THROW(run.append_metrics(4, {{"step", 1.0}}), std::invalid_argument);
  EXPECT_THROW(run.append_metrics(4, {{"a//b", 1.0}}), std::invalid_argument);
  EXPECT_EQ(run.steps(), (std::vector<int64_t>{3}));  // refused appends changed nothing
  EXPECT_THROW(run.metric("absent"), std::runtime_error);
}

TEST(RunFile, RestartTruncationGivesTheUninterruptedTable) {
  TempDir dir;
  const RunFile uninterrupted = RunFile::create(dir / "a.h5", two_rank_info());
  for (int64_t step = 1; step <= 6; ++step) uninterrupted.append_metrics(step, metrics_of(step));

  // Crashed after logging step 5 (its checkpoint of step 2 was the last one), with a
  // metric that only the lost steps recorded.
  const RunFile restarted = RunFile::create(dir / "b.h5", two_rank_info());
  for (int64_t step = 1; step <= 5; ++step) {
    MetricValues values = metrics_of(step);
    if (step == 4) values.push_back({"lost_only", 7.0});
    restarted.append_metrics(step, values);
  }
  RunFile::open(dir / "b.h5").truncate_after(2);
  EXPECT_EQ(restarted.steps(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(restarted.metric_names(), (std::vector<std::string>{"perf/tokens_per_s", "reward_mean"}));
  for (int64_t step = 3; step <= 6; ++step) restarted.append_metrics(step, metrics_of(step));

  EXPECT_EQ(restarted.steps(), uninterrupted.steps());
  ASSERT_EQ(restarted.metric_names(), uninterrupted.metric_names());
  for (const auto& name : uninterrupted.metric_names())
    expect_same_column(restarted.metric(name), uninterrupted.metric(name), name);
  restarted.truncate_after(6);  // nothing after 6: unchanged
  EXPECT_EQ(restarted.steps().size(), 6u);
}

TEST(RunFile, H5dumpReadsTheRunFile) {
  TempDir dir;
  const auto path = dir / kRunFileName;
  const RunFile run = RunFile::create(path, two_rank_info());
  for (int64_t step = 1; step <= 3; ++step) run.append_metrics(step, metrics_of(step));
  const auto header = run_command("h5dump -H " + path.string());
  ASSERT_EQ(header.exit_code, 0) << header.output;
  for (const char* expected :
       {"GROUP \"metrics\"", "DATASET \"reward_mean\"", "DATASET \"step\"", "DATASET \"deck\"", "DATASET \"devices\"",
        "ATTRIBUTE \"git_revision\"", "ATTRIBUTE \"ranks\"", "H5S_UNLIMITED"})
    EXPECT_NE(header.output.find(expected), std::string::npos) << expected << "\n" << header.output;
  const auto steps = run_command("h5dump -d /metrics/step " + path.string());
  ASSERT_EQ(steps.exit_code, 0) << steps.output;
  EXPECT_NE(steps.output.find("1, 2, 3"), std::string::npos) << steps.output;
}

// A user inspecting the run in h5py (which locks the files it opens) must not make the
// run's next append fail.
TEST(RunFile, AppendsWhileAnotherProcessHasTheFileOpen) {
  TempDir dir;
  const auto path = dir / kRunFileName;
  const RunFile run = RunFile::create(path, two_rank_info());
  run.append_metrics(1, {{"loss", 1.0}});
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t reader = fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);  // default access: locking on
    const char opened = file >= 0 ? 'y' : 'n';
    if (write(ready[1], &opened, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char opened = 0;
  ASSERT_EQ(read(ready[0], &opened, 1), 1);
  EXPECT_EQ(opened, 'y');
  EXPECT_NO_THROW(run.append_metrics(2, {{"loss", 0.5}}));
  kill(reader, SIGKILL);
  waitpid(reader, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  EXPECT_EQ(run.steps(), (std::vector<int64_t>{1, 2}));
}

TEST(RunFile, SamplesRoundTripAndFollowARestart) {
  TempDir dir;
  const auto path = dir / "run.h5";
  const RunFile run = RunFile::create(path, two_rank_info());
  auto sample = [](int k) {
    SampleRecord s;
    s.prompt_text = "1+" + std::to_string(k) + "=";
    s.completion_text = std::to_string(1 + k) + " ✓";
    s.prompt_tokens = {1, 5, 9, k};
    s.completion_tokens = std::vector<int32_t>(static_cast<size_t>(k), 7);
    for (int j = 0; j < k; ++j) {
      s.rollout_logp.push_back(-0.5f * j), s.train_logp.push_back(-0.5f * j - 1e-3f);
      s.entropy.push_back(0.1f * j), s.reference_logp.push_back(-0.4f * j);
      s.completion_pieces.push_back(j % 2 ? "é" : " x");
    }
    s.prompt_pieces = {"1", "+", std::to_string(k), "="};
    s.advantage = 0.25f * k;
    s.reward = k % 2;
    return s;
  };
  const std::vector<SampleRecord> at2 = {sample(1), sample(3), sample(0)}, at5 = {sample(2)};
  run.append_samples(2, at2);
  run.append_samples(5, at5);
  EXPECT_EQ(run.sample_steps(), (std::vector<int64_t>{2, 5}));
  const auto back = run.samples(2);
  ASSERT_EQ(back.size(), at2.size());
  for (size_t i = 0; i < at2.size(); ++i) {
    EXPECT_EQ(back[i].prompt_text, at2[i].prompt_text);
    EXPECT_EQ(back[i].completion_text, at2[i].completion_text);
    EXPECT_EQ(back[i].prompt_tokens, at2[i].prompt_tokens);
    EXPECT_EQ(back[i].completion_tokens, at2[i].completion_tokens);
    EXPECT_EQ(back[i].rollout_logp, at2[i].rollout_logp);
    EXPECT_EQ(back[i].train_logp, at2[i].train_logp);
    EXPECT_EQ(back[i].entropy, at2[i].entropy);
    EXPECT_EQ(back[i].reference_logp, at2[i].reference_logp);
    EXPECT_EQ(back[i].prompt_pieces, at2[i].prompt_pieces);
    EXPECT_EQ(back[i].completion_pieces, at2[i].completion_pieces);
    EXPECT_EQ(back[i].advantage, at2[i].advantage);
    EXPECT_EQ(back[i].reward, at2[i].reward);
  }
  SampleRecord broken = sample(2);
  broken.train_logp.pop_back();
  EXPECT_THROW(run.append_samples(6, {broken}), std::invalid_argument);
  SampleRecord no_reference = sample(2);
  no_reference.reference_logp.clear();
  run.append_samples(7, {no_reference});  // without a KL reference: no reference_logp column
  EXPECT_TRUE(run.samples(7).front().reference_logp.empty());
  run.append_metrics(5, {{"loss", 1.0}});
  run.truncate_after(3);
  EXPECT_EQ(run.sample_steps(), (std::vector<int64_t>{2}));
}
