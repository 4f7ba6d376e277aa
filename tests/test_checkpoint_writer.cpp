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
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "driver/colocated_memory.h"
#include "driver/checkpoint_writer.h"
#include "io/run_file.h"
#include "tensor/device_copy.h"
#include "support.h"

using namespace tandem;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// One small Qwen3 layer: 2.2 M parameters, 26 MB a checkpoint.
ModelConfig small_model() {
  ModelConfig config = ModelConfig::qwen3_0_6b(1);
  config.hidden = 256;
  config.heads = 2;
  config.kv_heads = 1;
  config.intermediate = 512;
  config.vocab = 2048;
  return config;
}

// A trainer whose state is a function of the step, and a run file in `folder` for the
// checkpoints' copies.
struct Trainer {
  const ModelConfig config = small_model();
  const ParameterLayout layout{config};
  std::unique_ptr<MemoryPool> pool = MemoryPool::create(Device::CPU);
  ColocatedMemory memory{*pool, layout, DType::F32, TransportKind::Alias};
  TrainerCheckpoint checkpoint{memory, OptimizerKind::AdamW};

  explicit Trainer(const fs::path& folder) {
    fs::create_directories(folder);
    RunFile::create(folder / kRunFileName, RunInfo{"[run]\n", "test", "-", 1, {"cpu"}, "now"});
  }
  void set_step(int64_t step) {
    for (const Tensor& slab : {memory.master(), memory.exp_avg(), memory.exp_avg_sq()}) {
      std::vector<float> values(static_cast<size_t>(slab.numel()));
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 7 + step * 131) % 1009) * 1e-3f;
      copy_host_to_tensor(slab, values.data());
    }
  }
};

void checkpoint_at(CheckpointWriter& writer, Trainer& trainer, int64_t step) {
  trainer.set_step(step);
  writer.snapshot(step, step * 10, "[run]\nsteps = 9\n", {"rank 0 state " + std::to_string(step)});
  trainer.set_step(step + 1000);  // the next step changes the state while the writer works
  writer.publish();
}

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
  TempDir dir;
  for (const bool background : {false, true}) {
    const fs::path folder = dir / (background ? "async" : "sync");
    Trainer trainer(folder);
    CheckpointWriter writer({folder, 2, background}, trainer.checkpoint, Device::CPU);
    checkpoint_at(writer, trainer, 4);
    checkpoint_at(writer, trainer, 8);  // waits for step 4's writer first
    writer.wait();
    EXPECT_EQ(writer.last_committed(), (folder / checkpoint_file_name(8)).string());
  }
  for (const int step : {4, 8}) {
    const std::string sync = tandem::testing::read_text(dir / "sync" / checkpoint_file_name(step));
    const std::string async = tandem::testing::read_text(dir / "async" / checkpoint_file_name(step));
    ASSERT_GT(sync.size(), 3 * sizeof(float) * static_cast<size_t>(ParameterLayout(small_model()).slab_elements()));
    size_t first = 0;
    while (first < std::min(sync.size(), async.size()) && sync[first] == async[first]) ++first;
    EXPECT_TRUE(sync == async) << "step " << step << ": the files differ from byte " << first << " of " << sync.size();
  }
  // What the file holds is the snapshot's state, not what the trainer moved on to.
  Trainer expected(dir / "expected");
  expected.set_step(8);
  std::vector<float> master(static_cast<size_t>(expected.layout.slab_elements()));
  copy_tensor_to_host(master.data(), expected.memory.master());
  Trainer loaded(dir / "loaded");
  loaded.checkpoint.read(Checkpoint::open(dir / "async" / checkpoint_file_name(8)));
  std::vector<float> read(master.size());
  copy_tensor_to_host(read.data(), loaded.memory.master());
  EXPECT_TRUE(read == master);
  EXPECT_TRUE(fs::exists(dir / "async" / "run.ckpt_00000008.h5"));
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
