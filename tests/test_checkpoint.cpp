#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <cstring>
#include <random>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "support.h"
#include "world/version.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// Contents that are a function of the step, so a loaded checkpoint can be checked
// against the step it claims: two tensors of 2 MiB each, cursor, RNG states, deck.
struct StepState {
  std::vector<uint32_t> weights;  // F32 bits [512, 1024]
  std::vector<uint16_t> embed;    // BF16 bits [1024, 1024]
  CheckpointContents contents;

  explicit StepState(int64_t step) : weights(512 * 1024), embed(1024 * 1024) {
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<uint32_t>(step * 2654435761u + i);
    for (size_t i = 0; i < embed.size(); ++i) embed[i] = static_cast<uint16_t>(step * 40503u + i * 7);
    contents.step = step;
    contents.data_cursor = step * 100;
    contents.deck_text = "[train]\nsteps = " + std::to_string(step) + "\n";
    contents.rng_states = {"rank0 " + std::to_string(step), std::string("rank1\0binary", 12) + std::to_string(step)};
    contents.tensors = {{"weights", Tensor::view(weights.data(), DType::F32, Device::CPU, {512, 1024})},
                        {"embed", Tensor::view(embed.data(), DType::BF16, Device::CPU, {1024, 1024})}};
  }
};

// Loads `path` and checks every part against the step it holds.
void expect_consistent(const fs::path& path) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  const StepState expected(checkpoint.step());
  EXPECT_EQ(path.filename().string(), checkpoint_file_name(checkpoint.step()));
  EXPECT_EQ(checkpoint.data_cursor(), expected.contents.data_cursor);
  EXPECT_EQ(checkpoint.deck_text(), expected.contents.deck_text);
  EXPECT_EQ(checkpoint.rng_states(), expected.contents.rng_states);
  std::vector<uint32_t> weights(512 * 1024);
  std::vector<uint16_t> embed(1024 * 1024);
  checkpoint.read_tensor("weights", Tensor::view(weights.data(), DType::F32, Device::CPU, {512, 1024}));
  checkpoint.read_tensor("embed", Tensor::view(embed.data(), DType::BF16, Device::CPU, {1024, 1024}));
  EXPECT_TRUE(weights == expected.weights) << path;
  EXPECT_TRUE(embed == expected.embed) << path;
}

std::set<std::string> files_in(const fs::path& folder) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.insert(entry.path().filename().string());
  return names;
}

// What restart = auto tries first: the newest file that opens; and why newer ones do not.
struct Newest {
  std::optional<fs::path> latest;
  std::vector<std::string> skipped;
};
Newest newest_that_opens(const fs::path& folder) {
  Newest newest;
  for (const fs::path& candidate : checkpoints_newest_first(folder)) {
    try {
      Checkpoint::open(candidate);
      newest.latest = candidate;
      return newest;
    } catch (const std::exception& error) {
      newest.skipped.push_back(error.what());
    }
  }
  return newest;
}

int64_t latest_step(const fs::path& folder) {
  const Newest newest = newest_that_opens(folder);
  if (!newest.latest) throw std::runtime_error("no checkpoint in " + folder.string());
  return Checkpoint::open(*newest.latest).step();
}

}  // namespace

TEST(Checkpoint, RoundTripsContentsAndListsTensors) {
  TempDir dir;
  const StepState state(10);
  const fs::path path = write_checkpoint(dir.path(), state.contents, 3);
  EXPECT_EQ(path, dir / "ckpt_00000010.h5");
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"ckpt_00000010.h5"}));
  const Checkpoint checkpoint = Checkpoint::open(path);
  EXPECT_EQ(checkpoint.step(), 10);
  EXPECT_EQ(checkpoint.version(), tandem_version());
  EXPECT_EQ(checkpoint.git_revision(), tandem_git_revision());
  ASSERT_EQ(checkpoint.tensors().size(), 2u);
  EXPECT_EQ(checkpoint.tensor("embed").dtype, DType::BF16);
  EXPECT_EQ(checkpoint.tensor("embed").shape, (std::vector<int64_t>{1024, 1024}));
  EXPECT_EQ(checkpoint.tensor("weights").dtype, DType::F32);
  expect_consistent(path);
}

TEST(Checkpoint, MissingOrMismatchedTensorNamesTheFileAndTensor) {
  TempDir dir;
  const fs::path path = write_checkpoint(dir.path(), StepState(10).contents, 3);
  const Checkpoint checkpoint = Checkpoint::open(path);
  std::vector<uint32_t> buffer(512 * 1024);
  try {
    checkpoint.read_tensor("layers.0.wq", Tensor::view(buffer.data(), DType::F32, Device::CPU, {512, 1024}));
    FAIL() << "read a missing tensor";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(path.string() + ": tensor 'layers.0.wq' is missing"), std::string::npos)
        << error.what();
  }
  try {
    checkpoint.read_tensor("weights", Tensor::view(buffer.data(), DType::F32, Device::CPU, {1024, 512}));
    FAIL() << "read with the wrong shape";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("ckpt_00000010.h5: tensor 'weights': shape [512,1024] in file, expected [1024,512]"),
              std::string::npos)
        << error.what();
  }
}

TEST(Checkpoint, CrashAfterTheTemporaryLeavesThePreviousOneLatest) {
  TempDir dir;
  write_checkpoint(dir.path(), StepState(1).contents, 2);
  const fs::path temporary = write_checkpoint_temporary(dir.path(), StepState(2).contents);
  EXPECT_EQ(temporary, dir / ".ckpt_00000002.h5.tmp");
  // The writer "dies" here, before commit.
  const Newest search = newest_that_opens(dir.path());
  ASSERT_TRUE(search.latest);
  EXPECT_EQ(*search.latest, dir / "ckpt_00000001.h5");
  EXPECT_TRUE(search.skipped.empty());
  expect_consistent(*search.latest);
  // A restarted writer that reaches step 2 again commits normally.
  commit_checkpoint(dir.path(), 2, 2);
  EXPECT_EQ(latest_step(dir.path()), 2);
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_THROW(commit_checkpoint(dir.path(), 3, 2), std::runtime_error);  // nothing written for 3
}

TEST(Checkpoint, CorruptIncompleteAndMisnamedFilesDoNotOpen) {
  TempDir dir;
  write_checkpoint(dir.path(), StepState(3).contents, 0);
  tandem::testing::write_text(dir / "ckpt_00000005.h5", "truncated garbage");
  {
    // Complete in every way except the marker, like a copy taken mid-write.
    write_checkpoint_temporary(dir.path(), StepState(4).contents);
    hdf5::File file = hdf5::File::open(dir / ".ckpt_00000004.h5.tmp", hdf5::File::Access::ReadWrite);
    H5Adelete(file.id(), "complete");
    file.close();
    fs::rename(dir / ".ckpt_00000004.h5.tmp", dir / "ckpt_00000004.h5");
  }
  fs::copy_file(dir / "ckpt_00000003.h5", dir / "ckpt_00000006.h5");  // holds step 3
  const Newest search = newest_that_opens(dir.path());
  ASSERT_TRUE(search.latest);
  EXPECT_EQ(*search.latest, dir / "ckpt_00000003.h5");
  ASSERT_EQ(search.skipped.size(), 3u);
  EXPECT_NE(search.skipped[0].find("ckpt_00000006.h5: holds step 3"), std::string::npos) << search.skipped[0];
  EXPECT_NE(search.skipped[1].find("ckpt_00000005.h5: cannot open HDF5 file"), std::string::npos) << search.skipped[1];
  EXPECT_NE(search.skipped[2].find("ckpt_00000004.h5: checkpoint is incomplete"), std::string::npos)
      << search.skipped[2];
  EXPECT_FALSE(newest_that_opens(dir / "absent").latest);
}

TEST(Checkpoint, KeepsTheLastKAndDropsStaleTemporaries) {
  TempDir dir;
  tandem::testing::write_text(dir / ".ckpt_00000099.h5.tmp", "left by a killed writer");
  tandem::testing::write_text(dir / "run.h5", "not a checkpoint, never touched");
  for (int64_t step = 1; step <= 5; ++step) write_checkpoint(dir.path(), StepState(step).contents, 2);
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"ckpt_00000004.h5", "ckpt_00000005.h5", "run.h5"}));
  write_checkpoint(dir.path(), StepState(6).contents, 0);  // 0 keeps all
  EXPECT_EQ(files_in(dir.path()).size(), 4u);
}

TEST(Checkpoint, RestartFromAnOlderStepDropsTheAbandonedTimeline) {
  TempDir dir;
  for (int64_t step = 1; step <= 3; ++step) write_checkpoint(dir.path(), StepState(step).contents, 5);
  // restart from step 1; the next checkpoint is step 2 of the new timeline
  write_checkpoint(dir.path(), StepState(2).contents, 5);
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"ckpt_00000001.h5", "ckpt_00000002.h5"}));
  EXPECT_EQ(latest_step(dir.path()), 2);
}

TEST(Checkpoint, H5dumpReadsTheCheckpoint) {
  TempDir dir;
  StepState state(7);
  uint8_t mask[4] = {1, 0, 0, 1};
  state.contents.tensors.push_back({"layers.0.mask", Tensor::view(mask, DType::BOOL, Device::CPU, {4})});
  const fs::path path = write_checkpoint(dir.path(), state.contents, 1);
  const auto header = run_command("h5dump -H " + path.string());
  ASSERT_EQ(header.exit_code, 0) << header.output;
  for (const char* expected :
       {"ATTRIBUTE \"complete\"", "ATTRIBUTE \"step\"", "ATTRIBUTE \"data_cursor\"", "GROUP \"rng_states\"",
        "DATASET \"rank_00001\"", "GROUP \"tensors\"", "DATASET \"embed\"", "DATASET \"layers.0.mask\"",
        "ATTRIBUTE \"dtype\"", "ATTRIBUTE \"shape\"", "DATASET \"deck\""})
    EXPECT_NE(header.output.find(expected), std::string::npos) << expected << "\n" << header.output;
  const auto dtype = run_command("h5dump -a /tensors/embed/dtype " + path.string());
  ASSERT_EQ(dtype.exit_code, 0) << dtype.output;
  EXPECT_NE(dtype.output.find("\"BF16\""), std::string::npos) << dtype.output;
  const auto shape = run_command("h5dump -a /tensors/embed/shape " + path.string());
  EXPECT_NE(shape.output.find("1024, 1024"), std::string::npos) << shape.output;
}

// A writer killed at random instants: whatever instant the kill lands on (inside the
// HDF5 writes, the fsync, the rename, the pruning), the newest complete checkpoint loads
// and its contents are exactly those of its step.
TEST(Checkpoint, KillAtAnyInstantLeavesALoadableCheckpoint) {
  TempDir dir;
  write_checkpoint(dir.path(), StepState(0).contents, 2);
  std::mt19937 random(20250101);
  int64_t previous = 0;
  for (int round = 0; round < 6; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        for (int64_t step = previous + 1;; ++step) write_checkpoint(dir.path(), StepState(step).contents, 2);
      } catch (...) {
        _exit(1);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(5, 250)(random)));
    ASSERT_EQ(kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself, status " << status;

    const Newest search = newest_that_opens(dir.path());
    ASSERT_TRUE(search.latest) << "round " << round;
    EXPECT_TRUE(search.skipped.empty()) << search.skipped.front();
    const int64_t latest = Checkpoint::open(*search.latest).step();
    EXPECT_GE(latest, previous) << "round " << round;
    expect_consistent(*search.latest);
    for (const auto& name : files_in(dir.path()))  // every checkpoint under a final name loads
      if (name.rfind("ckpt_", 0) == 0) expect_consistent(dir / name);
    previous = latest;
  }
  EXPECT_GT(previous, 0) << "no round got a checkpoint through; the kills came too early to test anything";
  write_checkpoint(dir.path(), StepState(previous + 1).contents, 2);
  for (const auto& name : files_in(dir.path())) EXPECT_EQ(name.rfind(".ckpt_", 0), std::string::npos) << name;
}

// Every tensor carries the XXH3 of its bytes: a byte changed on disk fails the read,
// naming the file and the tensor; the RNG states are verified when the file opens.
TEST(Checkpoint, AFlippedByteFailsItsTensorsChecksum) {
  TempDir dir;
  const fs::path path = write_checkpoint(dir.path(), StepState(10).contents, 3);
  haddr_t offset = HADDR_UNDEF;
  {
    const hdf5::File file = hdf5::File::open(path, hdf5::File::Access::ReadOnly);
    EXPECT_EQ(file.group("tensors").object_string_attribute("weights", "xxh3_64").size(), 16u);
    const hid_t dataset = H5Dopen2(file.id(), "/tensors/weights", H5P_DEFAULT);
    offset = H5Dget_offset(dataset);
    H5Dclose(dataset);
  }
  ASSERT_NE(offset, HADDR_UNDEF);
  std::string bytes = tandem::testing::read_text(path);
  bytes[offset + 12345] ^= 0x01;
  tandem::testing::write_text(path, bytes);
  const Checkpoint checkpoint = Checkpoint::open(path);
  std::vector<uint32_t> weights(512 * 1024);
  std::vector<uint16_t> embed(1024 * 1024);
  checkpoint.read_tensor("embed", Tensor::view(embed.data(), DType::BF16, Device::CPU, {1024, 1024}));  // intact
  try {
    checkpoint.read_tensor("weights", Tensor::view(weights.data(), DType::F32, Device::CPU, {512, 1024}));
    FAIL() << "read a corrupt tensor";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(path.string() + ": /tensors/weights: checksum mismatch"), std::string::npos)
        << error.what();
  }
}

// A companion (run.ckpt_<step>.h5) lives and dies with its checkpoint, and one whose
// checkpoint was never committed goes at the next commit.
TEST(Checkpoint, CompanionsArePrunedWithTheirCheckpoint) {
  TempDir dir;
  for (int64_t step = 1; step <= 3; ++step) {
    tandem::testing::write_text(dir / checkpoint_companion_name("run", step), "copy");
    write_checkpoint(dir.path(), StepState(step).contents, 2);
  }
  tandem::testing::write_text(dir / checkpoint_companion_name("run", 9), "orphan: its checkpoint never came");
  write_checkpoint(dir.path(), StepState(4).contents, 2);
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"ckpt_00000003.h5", "ckpt_00000004.h5", "run.ckpt_00000003.h5"}));
  EXPECT_EQ(checkpoints_newest_first(dir.path()),
            (std::vector<fs::path>{dir / "ckpt_00000004.h5", dir / "ckpt_00000003.h5"}));
}

// The tensors' bytes reach the disk past the page cache (whole 4 KiB blocks) or through it
// (DiskWrites::Buffered, what a filesystem refusing O_DIRECT gets): the same file either
// way, from memory at any alignment, with sizes no multiple of a block; every dataset of
// 64 KiB and more starts on a block boundary (h5dump -p shows each one's offset), and the
// file reads back whole.
TEST(Checkpoint, DirectAndBufferedWritesMakeTheSameFile) {
  TempDir dir;
  StepState state(5);
  std::vector<float> unaligned_size(300001), just_aligned(70000), small(3000);
  for (auto* values : {&unaligned_size, &just_aligned, &small})
    for (size_t i = 0; i < values->size(); ++i) (*values)[i] = static_cast<float>(i % 977) * 0.25f;
  state.contents.tensors.push_back({"unaligned_size", Tensor::view(unaligned_size.data(), DType::F32, Device::CPU, {300001})});
  state.contents.tensors.push_back({"aligned_size", Tensor::view(just_aligned.data(), DType::F32, Device::CPU, {70000})});
  state.contents.tensors.push_back({"small", Tensor::view(small.data(), DType::F32, Device::CPU, {1000, 3})});
  for (const auto& [name, writes] : {std::pair{"direct", DiskWrites::Direct}, std::pair{"buffered", DiskWrites::Buffered}}) {
    write_checkpoint_temporary(dir / name, state.contents, {}, writes);
    commit_checkpoint(dir / name, state.contents.step, 1);
  }
  const fs::path direct = dir / "direct" / checkpoint_file_name(5), buffered = dir / "buffered" / checkpoint_file_name(5);
  EXPECT_TRUE(tandem::testing::read_text(direct) == tandem::testing::read_text(buffered));

  const auto layout = run_command("h5dump -p -H -g /tensors " + direct.string());
  ASSERT_EQ(layout.exit_code, 0) << layout.output;
  const std::regex storage(R"re(DATASET "([^"]+)"[\s\S]*?CONTIGUOUS\s+SIZE (\d+)\s+OFFSET (\d+))re");
  size_t datasets = 0;
  for (std::sregex_iterator found(layout.output.begin(), layout.output.end(), storage), end; found != end; ++found) {
    ++datasets;
    const uint64_t size = std::stoull((*found)[2]), offset = std::stoull((*found)[3]);
    if (size >= 64 * 1024) EXPECT_EQ(offset % 4096, 0u) << (*found)[1] << " at " << offset;
  }
  EXPECT_EQ(datasets, state.contents.tensors.size()) << layout.output;

  expect_consistent(direct);
  const Checkpoint checkpoint = Checkpoint::open(direct);
  std::vector<float> read(unaligned_size.size());
  checkpoint.read_tensor("unaligned_size", Tensor::view(read.data(), DType::F32, Device::CPU, {300001}));
  EXPECT_TRUE(read == unaligned_size);
  const auto dump = run_command("h5dump -d /tensors/small -s 999,0 -c 1,3 " + direct.string());
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  EXPECT_NE(dump.output.find("(999,0): 16.5, 16.75, 17"), std::string::npos) << dump.output;
}
