// jobs/tandem.sbatch on a real one-node Slurm cluster (tools/slurm, started by the ctest
// fixture slurm_cluster_start): a job signalled in the middle of its run, as Slurm does
// ahead of a time limit (--signal=B:USR1), checkpoints, requeues itself and resumes until
// the run is complete; the run then equals the same run done uninterrupted, metric for
// metric. The test sends the signal itself once steps are under way (scancel --batch, the
// same delivery as --signal=B:): a time-based signal would race the run on a fast machine.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "support.h"

using tandem::testing::BackgroundCommand;
using tandem::testing::read_text;
using tandem::testing::run_command;
using tandem::testing::TempDir;

namespace {

const std::filesystem::path kSlurmDir = TANDEM_SLURM_DIR;

std::string slurm(const std::string& command) { return "SLURM_CONF=" + (kSlurmDir / "slurm.conf").string() + " " + command; }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(Slurm, JobSignalledMidRunRequeuesUntilTheRunIsComplete) {
  if (std::filesystem::exists(kSlurmDir / "skipped")) GTEST_SKIP() << "no Slurm here: " << read_text(kSlurmDir / "skipped");
  ASSERT_TRUE(std::filesystem::exists(kSlurmDir / "slurm.conf")) << "the fixture slurm_cluster_start did not run";
  TempDir dir("tandem-slurm");
  tandem::testing::write_text(dir / "run.deck",
                              "[run]\noutput-dir = " + dir.path().string() + "\nsteps = 90\ncheckpoint-every = 0\n"
                              "[sft]\nsteps = 45\n[world]\ndevice = cpu\nthreads = 1\n");
  const std::string mpi_env = "OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
                              "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
  // The uninterrupted run, meanwhile, outside Slurm.
  BackgroundCommand whole("env " + mpi_env + "mpirun -np 2 " + tandem::testing::tandem_binary() + " " + (dir / "run.deck").string() +
                              " --run.name=whole",
                          dir / "whole.out");

  const auto submitted = run_command(
      "cd " + dir.path().string() + " && " + mpi_env + "TANDEM=" + tandem::testing::tandem_binary() + " " +
      slurm("sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=10 "
            "--output=job.out " +
            (tandem::testing::source_dir() / "jobs/tandem.sbatch").string() + " run.deck --run.name=sliced"));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string job = submitted.output.substr(0, submitted.output.find_first_of(";\n"));

  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(8);
  bool signalled = false;
  while (!signalled && std::chrono::steady_clock::now() < end) {
    if (read_text(dir / "job.out").find("[step 10]") != std::string::npos) {
      const auto sent = run_command(slurm("scancel --batch --signal=USR1 " + job));
      ASSERT_EQ(sent.exit_code, 0) << sent.output;
      signalled = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_TRUE(signalled) << "the job never reached step 10:\n" << read_text(dir / "job.out");

  std::string state;
  while (std::chrono::steady_clock::now() < end) {
    state = run_command(slurm("scontrol show job " + job)).output;
    if (state.find("JobState=COMPLETED") != std::string::npos || state.find("JobState=FAILED") != std::string::npos ||
        state.find("JobState=CANCELLED") != std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  const std::string output = read_text(dir / "job.out");
  ASSERT_NE(state.find("JobState=COMPLETED"), std::string::npos) << state << output;
  EXPECT_EQ(count(output, "requeueing job"), 1u) << output;
  EXPECT_GE(count(output, "SIGUSR1 received"), 1u) << output;
  EXPECT_EQ(count(output, "resumed from"), count(output, "requeueing job")) << output;
  EXPECT_NE(output.find("the run is complete"), std::string::npos) << output;

  ASSERT_EQ(whole.wait(), 0) << read_text(dir / "whole.out");
  tandem::testing::expect_same_metrics(dir.path() / "whole", dir.path() / "sliced");
}
