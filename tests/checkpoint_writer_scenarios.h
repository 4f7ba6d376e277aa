// The background checkpoint writer's scenarios, run on the CPU (test_checkpoint_writer)
// and from a GPU's memory through pinned snapshots (gpu_checkpoint_writer).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "driver/checkpoint_writer.h"
#include "driver/colocated_memory.h"
#include "io/run_file.h"
#include "support.h"
#include "tensor/device_copy.h"

namespace tandem::testing {

// One small Qwen3 layer: 1.1 M parameters, 13 MB a checkpoint.
inline ModelConfig small_model() {
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
  std::unique_ptr<MemoryPool> pool;
  ColocatedMemory memory;
  TrainerCheckpoint checkpoint{memory, OptimizerKind::AdamW, MPI_COMM_SELF};

  explicit Trainer(const std::filesystem::path& folder, Device device = Device::CPU)
      : pool(MemoryPool::create(device)), memory(*pool, layout, ColocatedMemorySettings{}) {
    std::filesystem::create_directories(folder);
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

inline void checkpoint_at(CheckpointWriter& writer, Trainer& trainer, int64_t step) {
  trainer.set_step(step);
  writer.snapshot(step, step * 10, "[run]\nsteps = 9\n", {"rank 0 state " + std::to_string(step)});
  trainer.set_step(step + 1000);  // the next step changes the state while the writer works
  writer.publish();
}

// Synchronous and background checkpoints of steps 4 and 8 from a trainer on `device`
// are the same files, and hold the snapshot's state, not what the trainer moved on to;
// so are those of a background writer whose snapshot buffer was prepared on its own
// thread beforehand.
inline void expect_background_checkpoints_match_synchronous_ones(Device device) {
  TempDir dir;
  namespace fs = std::filesystem;
  for (const std::string mode : {"sync", "async", "prepared"}) {
    const fs::path folder = dir / mode;
    Trainer trainer(folder, device);
    CheckpointWriter writer({folder, 2, mode != "sync"}, trainer.checkpoint, device);
    if (mode == "prepared") writer.prepare_snapshot();
    checkpoint_at(writer, trainer, 4);
    checkpoint_at(writer, trainer, 8);  // waits for step 4's writer first
    writer.wait();
    EXPECT_EQ(writer.last_committed(), (folder / checkpoint_file_name(8)).string());
  }
  for (const int step : {4, 8}) {
    const std::string sync = tandem::testing::read_text(dir / "sync" / checkpoint_file_name(step));
    ASSERT_GT(sync.size(), 3 * sizeof(float) * static_cast<size_t>(ParameterLayout(small_model()).slab_elements()));
    for (const char* mode : {"async", "prepared"}) {
      const std::string async = tandem::testing::read_text(dir / mode / checkpoint_file_name(step));
      size_t first = 0;
      while (first < std::min(sync.size(), async.size()) && sync[first] == async[first]) ++first;
      EXPECT_TRUE(sync == async) << mode << ", step " << step << ": the files differ from byte " << first << " of "
                                 << sync.size();
    }
  }
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

}  // namespace tandem::testing
