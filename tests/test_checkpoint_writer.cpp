// The background checkpoint writer (run.checkpoint-async): its file is the synchronous
// writer's byte for byte, even when the trainer's state changes while it writes; a kill
// while it writes leaves the previous checkpoint the newest valid one and nothing torn
// under a final name; an exception (the writer's destructor) abandons a write without
// publishing it. The restart equivalence of a whole run is test_cli's and test_cli_stop's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_writer_scenarios.h"

using namespace tandem;
using namespace tandem::testing;
namespace fs = std::filesystem;

namespace {

// Every tensor of the checkpoint reads back and matches its checksum (read_tensor's check).
void expect_whole(const fs::path& path) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  for (const hdf5::TensorInfo& info : checkpoint.tensors()) {
    int64_t numel = 1;
    for (int64_t extent : info.shape) numel *= extent;
    std::vector<float> values(static_cast<size_t>(numel));
    EXPECT_NO_THROW(checkpoint.read_tensor(info.name, Tensor::view(values.data(), DType::F32, Device::CPU, info.shape)))
        << path;
  }
}

std::vector<std::string> names_in(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  return names;
}

}  // namespace

TEST(CheckpointWriter, ABackgroundCheckpointIsTheSynchronousOneByteForByte) {
  expect_background_checkpoints_match_synchronous_ones(Device::CPU);
}

TEST(CheckpointWriter, AKillWhileTheWriterIsBusyLeavesThePreviousCheckpointAndNothingTorn) {
  TempDir dir;
  const fs::path folder = dir / "run";
  const fs::path first = folder / checkpoint_file_name(1);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      Trainer trainer(folder);
      CheckpointWriter writer({folder, 2, true}, trainer.checkpoint, Device::CPU);
      for (int64_t step = 1;; ++step) checkpoint_at(writer, trainer, step);
    } catch (...) {
      _exit(1);
    }
  }
  // Once step 1 is committed, the kill lands while a later checkpoint's temporary is written.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(first) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(fs::exists(first)) << "the first checkpoint never came";
  bool busy = false;
  while (!busy && std::chrono::steady_clock::now() < deadline) {
    for (const std::string& name : names_in(folder)) busy = busy || name.find(".h5.tmp") != std::string::npos;
    if (!busy) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(busy) << "no write in flight to kill";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself, status " << status;

  const std::vector<fs::path> found = checkpoints_newest_first(folder);
  ASSERT_FALSE(found.empty());
  for (const fs::path& path : found) expect_whole(path);  // every file under a final name is whole
  for (const std::string& name : names_in(folder))
    if (name.find(".h5.tmp") != std::string::npos)  // the one in flight has no final name
      EXPECT_FALSE(fs::exists(folder / name.substr(1, name.size() - 5))) << name;
  EXPECT_TRUE(fs::exists(folder / ("run." + found.front().filename().string())));
}

TEST(CheckpointWriter, AnAbandonedWriteIsNeverPublished) {
  TempDir dir;
  const fs::path folder = dir / "run";
  Trainer trainer(folder);
  {
    CheckpointWriter writer({folder, 2, true}, trainer.checkpoint, Device::CPU);
    checkpoint_at(writer, trainer, 1);
    writer.wait();
    checkpoint_at(writer, trainer, 2);
  }  // as in an exception's unwinding: the write of step 2 is in flight
  EXPECT_TRUE(fs::exists(folder / checkpoint_file_name(1)));
  EXPECT_FALSE(fs::exists(folder / checkpoint_file_name(2)));
  for (const std::string& name : names_in(folder)) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

// checkpoint/write_seconds: a background write's time is reported once, after it ends,
// never while it is still running (a zero or the previous write's time).
TEST(CheckpointWriter, AWritesTimeIsReportedOnceItHasEnded) {
  TempDir dir;
  const fs::path folder = dir / "run";
  Trainer trainer(folder);
  CheckpointWriter writer({folder, 2, true}, trainer.checkpoint, Device::CPU);
  EXPECT_FALSE(writer.take_finished().has_value());
  checkpoint_at(writer, trainer, 1);
  std::optional<CheckpointWriter::Times> times;
  for (int polls = 0; !times && polls < 60000; ++polls) {
    times = writer.take_finished();
    if (!times) {
      EXPECT_TRUE(writer.in_flight()) << "nothing reported, yet the write has ended";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ASSERT_TRUE(times.has_value());
  EXPECT_GT(times->write_seconds, 0.0);
  EXPECT_FALSE(times->state_msync_seconds.has_value());  // no state file
  EXPECT_FALSE(writer.in_flight());
  EXPECT_FALSE(writer.take_finished().has_value());  // once
  EXPECT_EQ(writer.last_committed(), (folder / checkpoint_file_name(1)).string());
}

// optimizer.state = disk: every rank msyncs its state file after each checkpoint. In the
// background the snapshot does not wait for it: rank 0's writer thread runs it after the
// commit, the other ranks' from their snapshot on; synchronously the snapshot does. Its
// time comes with the checkpoint's.
TEST(CheckpointWriter, TheStateFileIsSyncedAfterEachCheckpoint) {
  TempDir dir;
  for (const bool background : {false, true}) {
    for (const bool root : {true, false}) {
      const std::string mode = std::string(background ? "background" : "synchronous") + (root ? ", rank 0" : ", rank 1");
      const fs::path folder = dir / (std::string(background ? "async" : "sync") + (root ? "0" : "1"));
      Trainer trainer(folder);
      OptimizerStateFile state(folder / "state", size_t{4} << 20);
      std::memset(state.data(), 7, state.bytes());  // dirty pages for the msync to write
      CheckpointWriter writer({folder, 2, background, root, &state}, trainer.checkpoint, Device::CPU);
      trainer.set_step(1);
      writer.snapshot(1, 10, "[run]\n", {"rank 0 state"});
      EXPECT_EQ(writer.in_flight(), background && !root) << mode;  // rank 1's msync is under way
      if (background && root) EXPECT_FALSE(writer.take_finished().has_value()) << "the snapshot ran the msync";
      writer.publish();
      EXPECT_EQ(writer.in_flight(), background) << mode;
      writer.wait();
      const std::optional<CheckpointWriter::Times> times = writer.take_finished();
      ASSERT_TRUE(times.has_value()) << mode;
      ASSERT_TRUE(times->state_msync_seconds.has_value()) << mode;
      EXPECT_GE(*times->state_msync_seconds, 0.0) << mode;
      EXPECT_EQ(fs::exists(folder / checkpoint_file_name(1)), root) << mode;
      if (background)
        EXPECT_GT(writer.longest_background_seconds(), 0.0) << mode;
      else
        EXPECT_EQ(writer.longest_background_seconds(), 0.0) << mode;
    }
  }
}
