// A job that loses nothing, driven as a user and an operator would: kill -9 around the
// checkpoint commit, a file-size limit reached while writing run.h5, a log file on a full
// device, flipped bytes in a checkpoint, NaN in a model's weights, a learning rate that
// makes the gradients overflow, decks that --check must refuse, and a restart with
// changed keys. Exit codes through the real binary: 2 bad input, 3 numerical failure.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <thread>

#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/safetensors.h"
#include "support.h"
#include "tiny_hf_folder.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string tandem_cmd(const std::string& args) { return tandem::testing::tandem_binary() + " " + args; }

// A model and batch small enough for a step in a few tens of milliseconds, samples every
// step (so run.h5 outgrows a checkpoint), a checkpoint every 2 steps.
std::string small_run(const TempDir& dir, const std::string& name, int steps) {
  return "--world.device=cpu --world.threads=1 --run.output-dir=" + dir.path().string() + " --run.name=" + name +
         " --run.steps=" + std::to_string(steps) +
         " --sft.steps=2 --run.checkpoint-every=2 --run.keep-checkpoints=5 --run.samples-every=1"
         " --model.layers=1 --model.hidden=32 --model.heads=2 --model.kv-heads=1 --model.head-dim=16"
         " --model.intermediate=64 --task.prompts-per-step=4 --grpo.group-size=4";
}

std::vector<int64_t> one_to(int64_t n) {
  std::vector<int64_t> steps;
  for (int64_t s = 1; s <= n; ++s) steps.push_back(s);
  return steps;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// tandem started in the background with its output in `log`; SIGXFSZ ignored, so a
// file-size limit makes writes fail (EFBIG) as a full disk does instead of killing it.
pid_t start_tandem(const std::string& args, const fs::path& log) {
  const std::string command = "exec " + tandem_cmd(args) + " > " + log.string() + " 2>&1";
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return child;
}

int wait_exit_code(pid_t child) {
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Flips one byte in the data of dataset `name` (contiguous layout) of an HDF5 file.
void flip_byte_of_dataset(const fs::path& file, const std::string& name, size_t at) {
  haddr_t offset = HADDR_UNDEF;
  {
    const hid_t handle = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(handle, 0);
    const hid_t dataset = H5Dopen2(handle, name.c_str(), H5P_DEFAULT);
    ASSERT_GE(dataset, 0) << name;
    offset = H5Dget_offset(dataset);
    H5Dclose(dataset);
    H5Fclose(handle);
  }
  ASSERT_NE(offset, HADDR_UNDEF);
  std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
  stream.seekg(static_cast<std::streamoff>(offset + at));
  char byte = 0;
  stream.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x5a);
  stream.seekp(static_cast<std::streamoff>(offset + at));
  stream.write(&byte, 1);
}

}  // namespace

// kill -9 the moment a checkpoint is committed (inotify sees the rename), or a little
// later, three jobs in a row, then a fourth that completes the run: the run file holds
// every step once, whatever instant each kill landed on. Before the fix, a kill between
// the commit and the step's row lost that row for good.
TEST(CliCrashSafety, KillNineAroundTheCheckpointCommitLosesNoRow) {
  TempDir dir;
  const fs::path folder = dir / "k";
  fs::create_directories(folder);
  const int steps = 8;
  const int delays_us[] = {0, 0, 3000};
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const int watch = inotify_init1(IN_CLOEXEC);
    ASSERT_GE(watch, 0);
    ASSERT_GE(inotify_add_watch(watch, folder.c_str(), IN_MOVED_TO), 0);
    const pid_t child = start_tandem(small_run(dir, "k", steps), dir / ("job" + std::to_string(round) + ".txt"));
    // The first checkpoint this job commits (round 0: step 2, then 4, then 6).
    bool killed = false;
    alignas(inotify_event) char buffer[4096];
    while (!killed) {
      // A job that ends, or never checkpoints within a minute, fails the test instead of hanging it.
      pollfd ready{watch, POLLIN, 0};
      if (poll(&ready, 1, 60000) != 1 || waitpid(child, nullptr, WNOHANG) != 0) {
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
        FAIL() << "the job ended, or wrote no checkpoint within a minute";
      }
      const ssize_t n = read(watch, buffer, sizeof buffer);
      ASSERT_GT(n, 0);
      for (char* at = buffer; at < buffer + n && !killed;) {
        const auto* event = reinterpret_cast<const inotify_event*>(at);
        if (event->len && std::regex_match(event->name, std::regex(R"(ckpt_\d+\.h5)"))) {
          if (delays_us[round]) std::this_thread::sleep_for(std::chrono::microseconds(delays_us[round]));
          ASSERT_EQ(kill(child, SIGKILL), 0);
          killed = true;
        }
        at += sizeof(inotify_event) + event->len;
      }
    }
    close(watch);
    EXPECT_EQ(wait_exit_code(child), 128 + SIGKILL);
  }
  const auto last = run_command(tandem_cmd(small_run(dir, "k", steps)));
  ASSERT_EQ(last.exit_code, 0) << last.output;
  const RunFile run = RunFile::open(folder / kRunFileName);
  EXPECT_EQ(run.steps(), one_to(steps));
  EXPECT_EQ(run.jobs().size(), 4u);
  for (const char* metric : {"loss", "reward_mean", "data_cursor"})
    for (double value : run.metric(metric)) EXPECT_FALSE(std::isnan(value)) << metric;
}

// The file-size limit reached while run.h5 grows (a full disk, as far as the writer can
// tell): the job fails, and a restart without the limit resumes from the newest
// checkpoint, restoring run.h5 from the copy taken with it. Before the fix every restart
// refused: "cannot open HDF5 file: truncated file".
TEST(CliCrashSafety, DiskFullWhileWritingTheRunFileStaysResumable) {
  TempDir dir;
  const fs::path folder = dir / "full";
  const pid_t child = start_tandem(small_run(dir, "full", 10), dir / "full.txt");
  while (!fs::exists(folder / checkpoint_file_name(2))) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Checkpoints are ~160 kB; run.h5 is ~600 kB by now and grows by ~12 kB of samples a
  // step: the next append crosses the limit.
  const rlim_t size = fs::file_size(folder / kRunFileName) + 4096;
  const rlimit limit{size, size};
  ASSERT_EQ(prlimit(child, RLIMIT_FSIZE, &limit, nullptr), 0) << std::strerror(errno);
  const int code = wait_exit_code(child);
  const std::string output = tandem::testing::read_text(dir / "full.txt");
  ASSERT_NE(code, 0) << output;
  EXPECT_TRUE(contains(output, "File too large")) << output;

  const auto resumed = run_command(tandem_cmd(small_run(dir, "full", 10)));
  ASSERT_EQ(resumed.exit_code, 0) << output << "\n---\n" << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from")) << resumed.output;
  const RunFile run = RunFile::open(folder / kRunFileName);
  EXPECT_EQ(run.steps(), one_to(10));
  ASSERT_EQ(run.jobs().size(), 2u);
  EXPECT_EQ(run.jobs()[1].resumed_from.empty(), false);
}

// A log file that cannot be written (here on /dev/full): the run goes on, and says so once.
TEST(CliCrashSafety, AFailedLogWriteIsReportedOnce) {
  TempDir dir;
  fs::create_directories(dir / "log");
  fs::create_symlink("/dev/full", dir / "log" / "tandem.log");
  const auto result = run_command(tandem_cmd(small_run(dir, "log", 3)));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count_of(result.output, "cannot write the log file"), 1) << result.output;
  EXPECT_TRUE(contains(result.output, "No space left on device")) << result.output;
}

// Bytes flipped inside a tensor of the newest checkpoint: a named restart refuses it
// (exit 2) naming the file and the tensor; restart = auto passes over it with a warning
// and resumes from the one before. Before the fix the bytes loaded silently.
TEST(CliCrashSafety, FlippedBytesInACheckpointAreFoundAndAutoFallsBack) {
  TempDir dir;
  ASSERT_EQ(run_command(tandem_cmd(small_run(dir, "flip", 4))).exit_code, 0);
  const fs::path newest = dir / "flip" / "ckpt_00000004.h5";
  const std::string tensor = "master.model.layers.0.mlp.up_proj.weight";
  flip_byte_of_dataset(newest, "/tensors/" + tensor, 100);

  const auto named = run_command(tandem_cmd(small_run(dir, "flip", 6) + " --run.restart=" + newest.string()));
  EXPECT_EQ(named.exit_code, 2) << named.output;
  EXPECT_TRUE(contains(named.output, newest.string() + ": /tensors/" + tensor + ": checksum mismatch")) << named.output;

  const auto automatic = run_command(tandem_cmd(small_run(dir, "flip", 6)));
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  EXPECT_TRUE(contains(automatic.output, "warning: restart = auto passes over " + newest.string())) << automatic.output;
  EXPECT_TRUE(contains(automatic.output, "resumed from " + (dir / "flip" / "ckpt_00000002.h5").string() + " at step 2"))
      << automatic.output;
  const RunFile run = RunFile::open(dir / "flip" / kRunFileName);
  EXPECT_EQ(run.steps(), one_to(6));
  ASSERT_EQ(run.jobs().size(), 2u);
  ASSERT_EQ(run.jobs()[1].notes.size(), 1u);
  EXPECT_TRUE(contains(run.jobs()[1].notes[0], "checksum mismatch")) << run.jobs()[1].notes[0];
}

// A NaN in a pretrained model's safetensors: exit 2 naming the file and the tensor, before
// any step (it used to surface as "Sampler::sample: logit 0 is -nan").
TEST(CliCrashSafety, NanInModelWeightsIsBadInputNamingTheTensor) {
  TempDir dir;
  fs::create_directories(dir / "model");
  tandem::testing::write_tiny_hf_model(dir / "model");
  const fs::path weights = dir / "model" / "model.safetensors";
  const std::string tensor = "model.layers.0.self_attn.k_proj.weight";
  size_t offset = 0;
  {
    const SafetensorsFile file(weights);
    ASSERT_EQ(file.entry(tensor).dtype, DType::F32);
    offset = file.entry(tensor).offset + 4 * 5;  // element 5
  }
  {
    std::fstream stream(weights, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    stream.read(reinterpret_cast<char*>(&header), 8);
    const float nan = std::nanf("");
    stream.seekp(static_cast<std::streamoff>(8 + header + offset));
    stream.write(reinterpret_cast<const char*>(&nan), 4);
  }
  tandem::testing::write_text(dir / "prompts.jsonl", "{\"prompt\": \"What is 2+3?\", \"answer\": 5}\n");
  const auto result = run_command(tandem_cmd(
      "--world.device=cpu --run.output-dir=" + dir.path().string() + " --run.name=nan --model.path=" +
      (dir / "model").string() + " --task.name=jsonl --task.path=" + (dir / "prompts.jsonl").string() +
      " --run.steps=1 --task.prompts-per-step=1 --grpo.group-size=2 --grpo.max-new-tokens=2"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, weights.string() + ": tensor '" + tensor + "': element 5 of")) << result.output;
  EXPECT_TRUE(contains(result.output, "is NaN")) << result.output;
}

// lr = 1e30 overflows the weights and the next step's gradients: stop (the default) ends
// with exit 3 naming the step, the micro-batch and the tensor, after that step's row and a
// checkpoint, and the message is in tandem.log too; skip goes on, counting the steps.
TEST(CliCrashSafety, NonFiniteGradientsStopWithExitThreeOrAreSkippedAndCounted) {
  TempDir dir;
  const std::string args = " --grpo.lr=1e30 --train.micro-batch-tokens=64";
  const auto stopped = run_command(tandem_cmd(small_run(dir, "stop", 8) + args));
  ASSERT_EQ(stopped.exit_code, 3) << stopped.output;
  const std::smatch found = [&] {
    std::smatch match;
    std::regex_search(stopped.output, match,
                      std::regex(R"(tandem: step (\d+): the gradients hold NaN or Inf \(grad norm [-a-z]+\); )"
                                 R"(rank 0: micro-batch (\d+) of (\d+), tensor ([\w.]+);)"));
    return match;
  }();
  ASSERT_FALSE(found.empty()) << stopped.output;
  const int64_t step = std::stoll(found[1].str());
  EXPECT_GT(std::stoi(found[3].str()), 1);  // the batch was split, and one of them named
  const RunFile run = RunFile::open(dir / "stop" / kRunFileName);
  EXPECT_EQ(run.steps(), one_to(step));
  EXPECT_EQ(run.metric("skipped").back(), 1.0);
  EXPECT_TRUE(fs::exists(dir / "stop" / checkpoint_file_name(step)));
  EXPECT_TRUE(contains(tandem::testing::read_text(dir / "stop" / "tandem.log"), "fatal: " + found[0].str().substr(8)));

  const auto skipped = run_command(tandem_cmd(small_run(dir, "skip", 8) + args + " --train.on-nonfinite=skip"));
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  const std::vector<double> flags = RunFile::open(dir / "skip" / kRunFileName).metric("skipped");
  double count = 0;
  for (double flag : flags) count += flag;
  EXPECT_GE(count, 1.0);
  EXPECT_EQ(count_of(skipped.output, "update skipped ("), static_cast<int>(count)) << skipped.output;
  EXPECT_TRUE(contains(skipped.output, "warning: step " + std::to_string(step) + ": the gradients hold NaN or Inf"))
      << skipped.output;
}

// What --check can tell from the deck alone is refused there, with exit 2.
TEST(CliCrashSafety, CheckRefusesWhatTheDeckAloneShowsWrong) {
  const struct {
    const char* override;
    const char* message;
  } cases[] = {
      {"--rollout.kv-cache=1B", "key 'rollout.kv-cache': 1 bytes do not hold one KV block of 16 tokens"},
      {"--run.name=../../x", "key 'run.name': '../../x' is not a plain name"},
      {"--grpo.group-size=1", "grpo.group-size = 1 gives every sample a zero advantage"},
  };
  for (const auto& c : cases) {
    const auto result = run_command(tandem_cmd(std::string("--check ") + c.override));
    EXPECT_EQ(result.exit_code, 2) << c.override << "\n" << result.output;
    EXPECT_TRUE(contains(result.output, c.message)) << result.output;
  }
  // An SFT-only run has no GRPO step for a group of one to spoil.
  EXPECT_EQ(run_command(tandem_cmd("--check --grpo.group-size=1 --run.steps=3 --sft.steps=3")).exit_code, 0);
}

// A restart under a changed deck says which keys changed, and run.h5 keeps every job's
// deck and resume record.
TEST(CliCrashSafety, RestartWithChangedKeysSaysWhichAndKeepsEveryDeck) {
  TempDir dir;
  ASSERT_EQ(run_command(tandem_cmd(small_run(dir, "change", 4))).exit_code, 0);
  const auto resumed = run_command(tandem_cmd(small_run(dir, "change", 6) + " --grpo.lr=0.0005"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "warning: the deck changed since the checkpoint: run.steps: 4 -> 6")) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "warning: the deck changed since the checkpoint: grpo.lr: 0.001 -> 0.0005"))
      << resumed.output;
  const std::vector<JobRecord> jobs = RunFile::open(dir / "change" / kRunFileName).jobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_TRUE(jobs[0].resumed_from.empty());
  EXPECT_TRUE(contains(jobs[0].deck_text, "steps = 4"));
  EXPECT_EQ(jobs[1].resumed_from, (dir / "change" / "ckpt_00000004.h5").string());
  EXPECT_EQ(jobs[1].resumed_step, 4);
  EXPECT_TRUE(contains(jobs[1].deck_text, "steps = 6"));
  EXPECT_EQ(jobs[1].changed_keys, (std::vector<std::string>{"run.steps: 4 -> 6", "grpo.lr: 0.001 -> 0.0005"}));
}
