// Stopping a job cleanly: a signal (to the process, to mpirun, to one rank) or run.max-time
// ends every rank at the same step with a checkpoint and exit code 0, and the restart from
// it continues the run as if nothing happened; a second signal ends it at once. Ranks whose
// decks differ, or one rank's bad deck, end the job with exit code 2 before it starts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "io/run_file.h"
#include "support.h"

using namespace tandem;
using tandem::testing::BackgroundCommand;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

// Seconds from the first to the last "HH:MM:SS.ffffff" time stamp that starts a line of
// tandem's log (the run does not pass midnight twice).
double log_span_seconds(const std::string& output) {
  std::vector<double> stamps;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    int hours = 0, minutes = 0;
    double seconds = 0;
    if (line.size() > 15 && line[2] == ':' && line[5] == ':' && std::sscanf(line.c_str(), "%2d:%2d:%lf", &hours, &minutes, &seconds) == 3)
      stamps.push_back(hours * 3600.0 + minutes * 60.0 + seconds);
  }
  if (stamps.size() < 2) return 0;
  const double span = stamps.back() - stamps.front();
  return span < 0 ? span + 86400 : span;
}

std::string tandem_cmd(const std::string& args) { return tandem::testing::tandem_binary() + " " + args; }

std::string mpirun_flags() {
  return std::string("env OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe ") +
         (getuid() == 0 ? "--allow-run-as-root " : "");
}

std::string run_args(const TempDir& dir, const std::string& name) {
  return "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --run.steps=16 --sft.steps=3 --run.checkpoint-every=0";
}

// A random moment after the first step: the signal lands anywhere in a step, and well
// before the run's end on a fast machine (16 steps of ~0.1-0.2 s; on 2 idle cores 8 steps
// once ended within 1.3 s, before a later signal).
double random_delay() {
  static std::mt19937 rng(std::random_device{}());
  return std::uniform_real_distribution<double>(0.0, 0.6)(rng);
}

enum class Target { Process, OneRank };

// Starts `command` (a run named `name`), signals it at a random moment, expects a clean
// stop with a checkpoint, then resumes the run to its end with `resume`.
void stop_and_resume(const TempDir& dir, const std::string& name, const std::string& command, const std::string& resume,
                     int signal, Target target) {
  const auto folder = dir.path() / name;
  BackgroundCommand job(command, dir / (name + ".out"));
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / (name + ".out"), "[step 1]", 60)) << tandem::testing::read_text(dir / (name + ".out"));
  const double delay = random_delay();
  SCOPED_TRACE(std::string(strsignal(signal)) + " after " + std::to_string(delay) + " s");
  std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  if (target == Target::OneRank) {
    const std::vector<int> ranks = job.children();
    ASSERT_EQ(ranks.size(), 2u);
    kill(ranks[1], signal);
  } else {
    job.signal(signal);
  }
  const int code = job.wait();
  const std::string output = tandem::testing::read_text(dir / (name + ".out"));
  ASSERT_EQ(code, 0) << output;
  const size_t stopped = output.find("stopped at step ");
  ASSERT_NE(stopped, std::string::npos) << output;
  const int step = std::stoi(output.substr(stopped + 16));
  const char* signal_name = signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "SIGUSR1";
  EXPECT_NE(output.find(std::string(signal_name) + " received"), std::string::npos) << output;
  char checkpoint[32];
  std::snprintf(checkpoint, sizeof checkpoint, "ckpt_%08d.h5", step);
  EXPECT_TRUE(std::filesystem::exists(folder / checkpoint)) << output;
  EXPECT_EQ(RunFile::open(folder / kRunFileName).steps().back(), step);

  const auto resumed = run_command(resume);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(std::string(checkpoint) + " at step " + std::to_string(step)), std::string::npos) << resumed.output;
}

}  // namespace

TEST(CliStop, SignalsToTheProcessStopCleanlyAndTheRestartMatches) {
  TempDir dir;
  ASSERT_EQ(run_command(tandem_cmd(run_args(dir, "whole"))).exit_code, 0);
  const std::pair<int, const char*> cases[] = {{SIGTERM, "term"}, {SIGINT, "int"}, {SIGUSR1, "usr1"}};
  for (const auto& [signal, name] : cases) {
    const std::string command = tandem_cmd(run_args(dir, name));
    stop_and_resume(dir, name, "env OMP_NUM_THREADS=1 " + command, command, signal, Target::Process);
    tandem::testing::expect_same_metrics(dir.path() / "whole", dir.path() / name);
  }
}

// mpirun forwards SIGUSR1 to every rank; a signal to one rank alone stops all of them at
// the same step, through the stop flag every rank reduces at the step boundary.
TEST(CliStop, SignalsUnderMpirunStopEveryRankAtOneStep) {
  TempDir dir;
  const std::string mpirun = mpirun_flags() + "-np 2 ";
  ASSERT_EQ(run_command(mpirun + tandem_cmd(run_args(dir, "whole"))).exit_code, 0);
  const std::tuple<int, Target, const char*> cases[] = {
      {SIGUSR1, Target::Process, "mpirun-usr1"}, {SIGTERM, Target::OneRank, "rank-term"}, {SIGINT, Target::OneRank, "rank-int"}};
  for (const auto& [signal, target, name] : cases) {
    const std::string command = mpirun + tandem_cmd(run_args(dir, name));
    stop_and_resume(dir, name, command, command, signal, target);
    tandem::testing::expect_same_metrics(dir.path() / "whole", dir.path() / name);
  }
}

TEST(CliStop, ASecondSignalEndsAtOnce) {
  TempDir dir;
  BackgroundCommand job("env OMP_NUM_THREADS=1 " + tandem_cmd(run_args(dir, "twice")), dir / "out");
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / "out", "[step 1]", 60));
  job.signal(SIGTERM);
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / "out", "received SIGTERM", 10));
  job.signal(SIGTERM);
  ASSERT_TRUE(job.ended_within(2.0));
  const std::string output = tandem::testing::read_text(dir / "out");
  EXPECT_EQ(job.wait(), 128 + SIGTERM) << output;
  EXPECT_NE(output.find("a second stop signal: ending now"), std::string::npos) << output;
  EXPECT_EQ(output.find("stopped at step"), std::string::npos) << output;
}

// Like GROMACS -maxh: the job stops by itself before the limit, leaving room for a step
// and a checkpoint.
TEST(CliStop, MaxTimeStopsBeforeTheLimitWithACheckpoint) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_command("OMP_NUM_THREADS=1 " + tandem_cmd(run_args(dir, "max") + " --run.steps=1000 --run.max-time=3s"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("the time limit is near"), std::string::npos) << result.output;
  const size_t stopped = result.output.find("stopped at step ");
  ASSERT_NE(stopped, std::string::npos) << result.output;
  const int step = std::stoi(result.output.substr(stopped + 16));
  EXPECT_GT(step, 1);
  EXPECT_LT(step, 1000);
  EXPECT_EQ(RunFile::open(dir.path() / "max" / kRunFileName).steps().back(), step);
  // The limit holds for tandem's own clock, from its first log line to its last; the
  // process's start (loading the CUDA libraries) comes before it and takes what the
  // machine's load makes it, so the wall time gets a wide bound only.
  EXPECT_LT(log_span_seconds(result.output), 3.0) << result.output;
  EXPECT_LT(seconds, 3.0 + 10.0) << "3 s of run.max-time, plus the start-up before it counts";
}

// MPMD: each rank reads its own deck. Different values refuse to start, naming the key; a
// bad deck on one rank ends both (today the other rank hangs in its first collective).
TEST(CliStop, RanksWithDifferentDecksRefuseToStart) {
  TempDir dir;
  const std::string args = run_args(dir, "mpmd");
  const auto differ = run_command("timeout 60 " + mpirun_flags() + "-np 1 " + tandem_cmd(args + " --grpo.lr=0.001") + " : -np 1 " +
                                  tandem_cmd(args + " --grpo.lr=0.002"));
  EXPECT_EQ(differ.exit_code, 2) << differ.output;
  EXPECT_NE(differ.output.find("the ranks run different decks"), std::string::npos) << differ.output;
  EXPECT_NE(differ.output.find("rank 1: grpo.lr = 0.002, rank 0: grpo.lr = 0.001"), std::string::npos) << differ.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "mpmd"));

  const auto bad = run_command("timeout 60 " + mpirun_flags() + "-np 1 " + tandem_cmd(args) + " : -np 1 " +
                               tandem_cmd(args + " --grpo.lrr=0.002"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("rank 1: command line: key 'grpo.lrr'"), std::string::npos) << bad.output;
}

// Bad input found after start-up (a named restart checkpoint that is not there) is exit
// code 2 too, on one rank and on two.
TEST(CliStop, BadInputAfterStartUpExitsTwo) {
  TempDir dir;
  const std::string args = run_args(dir, "restart") + " --run.restart=" + (dir / "none.h5").string();
  for (const std::string& launcher : {std::string(), mpirun_flags() + "-np 2 "}) {
    const auto result = run_command("timeout 60 " + launcher + tandem_cmd(args));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("run.restart"), std::string::npos) << result.output;
  }
}

namespace {

// utime + stime of a process, in seconds.
double cpu_seconds(int pid) {
  const std::string stat = tandem::testing::read_text("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i < 14; ++i) rest >> field;  // fields 3..13
  double user = 0, system = 0;
  rest >> user >> system;
  return (user + system) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int mpi_rank_of(int pid) {
  const std::string environ = tandem::testing::read_text("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
  const size_t at = environ.find(key);
  return at == std::string::npos ? -1 : std::stoi(environ.substr(at + key.size()));
}

}  // namespace

// A rank that stops (SIGSTOP) is named by the one after it in the ring within
// world.stall-timeout, the job ends, and while it waits the other rank sleeps.
TEST(CliStop, AStoppedRankIsReportedAndTheOthersDoNotSpin) {
  TempDir dir;
  BackgroundCommand job(mpirun_flags() + "-np 2 " + tandem_cmd(run_args(dir, "stall") + " --run.steps=1000 --world.stall-timeout=4s"),
                        dir / "out");
  ASSERT_TRUE(tandem::testing::wait_for_text(dir / "out", "[step 2]", 60)) << tandem::testing::read_text(dir / "out");
  const std::vector<int> ranks = job.children();
  ASSERT_EQ(ranks.size(), 2u);
  kill(ranks[1], SIGSTOP);
  const int stopped_rank = mpi_rank_of(ranks[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double cpu_before = cpu_seconds(ranks[0]);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double busy = (cpu_seconds(ranks[0]) - cpu_before) / 2.0;
  EXPECT_LT(busy, 0.2) << "the waiting rank used " << busy * 100 << "% of a core";
  const bool ended = job.ended_within(30);
  kill(ranks[1], SIGCONT);
  ASSERT_TRUE(ended) << tandem::testing::read_text(dir / "out");
  const std::string output = tandem::testing::read_text(dir / "out");
  EXPECT_EQ(job.wait(), 1) << output;
  EXPECT_NE(output.find("rank " + std::to_string(stopped_rank) + " has not reached "), std::string::npos) << output;
  EXPECT_NE(output.find("(world.stall-timeout): it stopped answering"), std::string::npos) << output;
}
