// sync.transport = disk-delta as the user runs it, under mpirun, colocated (every rank
// writes its share of each version and every engine reads all of them) and with rollout
// ranks (the trainer ranks write, the rollout ranks read). The published versions decode
// back to the trainer's weights bit for bit, the run's metrics are those of a colocated
// copy-transport run, and every failure (a wrong baseline on one rank's share, a corrupt
// file an engine reads, a full disk) stops every rank together with its message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "disk_delta_support.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/safetensors.h"
#include "model/parameters.h"
#include "support.h"
#include "sync/delta_format.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;
using tandem::testing::decode_version;
using tandem::testing::is_transport_specific;
using tandem::testing::kDiskDeltaNewestVersion;
using tandem::testing::kDiskDeltaSteps;
namespace fs = std::filesystem;

namespace {

std::string mpirun(int np) {
  return std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 timeout 120 mpirun --oversubscribe ") +
         (getuid() == 0 ? "--allow-run-as-root " : "") + "-np " + std::to_string(np) + " ";
}

// `trainers` ranks, and `rollout_ranks` more that only generate; prompts for `trainers` ranks.
std::string run(const TempDir& dir, int trainers, int rollout_ranks, const std::string& name, const std::string& extra) {
  return mpirun(trainers + rollout_ranks) +
         tandem::testing::disk_delta_run(dir, name, "cpu", trainers,
                                         extra + (rollout_ranks ? " --world.rollout-ranks=" + std::to_string(rollout_ranks) : ""));
}

// Writes the model folder's weights to `to` with one tensor changed by `change`.
void write_wrong_baseline(const fs::path& from, const fs::path& to, const std::string& tensor,
                          const std::function<void(SafetensorsTensor&, std::vector<std::byte>&)>& change) {
  const SafetensorsFile file(from / kSafetensorsSingleName);
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::vector<std::byte>> changed;
  changed.reserve(file.entries().size());
  for (const SafetensorsEntry& entry : file.entries()) {
    const auto bytes = file.bytes(entry.name);
    std::vector<std::byte>& data = changed.emplace_back(bytes.begin(), bytes.end());
    SafetensorsTensor written{entry.name, entry.dtype, entry.shape, nullptr};
    if (entry.name == tensor) change(written, data);
    if (written.name.empty()) continue;  // dropped
    written.data = data.data();
    tensors.push_back(written);
  }
  fs::create_directories(to);
  write_safetensors(to / kSafetensorsSingleName, tensors);
}

// Run `name` (a disk-delta run of `sources` trainer ranks) against a copy-transport run:
// every metric but the transport's own (and the handoffs', which rollout ranks have none of) is equal; each step has a delta; the last two
// versions are kept, each with a file per source rank, and the newest decodes to the final
// checkpoint's master weights (FP32 on the CPU) bit for bit.
void expect_disk_delta_run_matches_copy(const TempDir& dir, const std::string& copy_name, const std::string& name, int sources,
                                        bool rollout_ranks) {
  const RunFile copy_run = RunFile::open(dir / copy_name / kRunFileName);
  const RunFile delta_run = RunFile::open(dir / name / kRunFileName);
  size_t compared = 0;
  for (const std::string& metric : copy_run.metric_names()) {
    if (is_transport_specific(metric) || (rollout_ranks && metric.rfind("handoff/", 0) == 0)) continue;
    EXPECT_EQ(copy_run.metric(metric), delta_run.metric(metric)) << metric;
    ++compared;
  }
  EXPECT_GT(compared, 10u);
  const std::vector<double> density = delta_run.metric("sync/density"), wire = delta_run.metric("sync/wire_bytes");
  ASSERT_EQ(density.size(), static_cast<size_t>(kDiskDeltaSteps));
  for (int s = 0; s < kDiskDeltaSteps; ++s) {
    EXPECT_GT(density[s], 0) << s;
    EXPECT_LE(density[s], 1) << s;
    EXPECT_GT(wire[s], 0) << s;
  }

  const fs::path weights = dir / name / "weights";
  const SafetensorsCheckpoint baseline(dir / "model");
  EXPECT_FALSE(fs::exists(delta_version_folder(weights, kDiskDeltaNewestVersion - 2)));
  const DeltaIndex index = read_delta_index(delta_version_folder(weights, kDiskDeltaNewestVersion));
  EXPECT_EQ(index.version, kDiskDeltaNewestVersion);
  EXPECT_EQ(index.base_version, 0);
  for (int r = 0; r < sources; ++r)
    EXPECT_TRUE(fs::exists(delta_version_folder(weights, kDiskDeltaNewestVersion) / delta_file_name(r, sources))) << r;
  EXPECT_FALSE(fs::exists(delta_version_folder(weights, kDiskDeltaNewestVersion) / delta_file_name(sources, sources + 1)));
  decode_version(delta_version_folder(weights, kDiskDeltaNewestVersion - 1), baseline);
  const auto decoded = decode_version(delta_version_folder(weights, kDiskDeltaNewestVersion), baseline);
  const Checkpoint checkpoint = Checkpoint::open(dir / name / checkpoint_file_name(kDiskDeltaSteps));
  ASSERT_EQ(decoded.size(), baseline.names().size());
  for (const auto& [tensor, bytes] : decoded) {
    const SafetensorsEntry& entry = baseline.file_of(tensor)->entry(tensor);
    std::vector<std::byte> master(bytes.size());
    checkpoint.read_tensor("master." + tensor, Tensor::view(master.data(), DType::F32, Device::CPU, entry.shape));
    EXPECT_TRUE(master == bytes) << tensor;
  }
}

}  // namespace

// Colocated: -np 3 from the run's initial weights (xor), -np 4 from the model folder as
// sync.baseline (overwrite).
TEST(CliDiskDelta, VersionsDecodeToTheTrainersWeightsAndMetricsMatchCopy) {
  TempDir dir;
  tandem::testing::write_disk_delta_inputs(dir);
  for (const auto& [np, options] : {std::pair<int, std::string>{3, ""},
                                    {4, "--sync.delta-encoding=overwrite --sync.baseline=" + (dir / "model").string()}}) {
    SCOPED_TRACE(np);
    const std::string copy = "copy" + std::to_string(np), name = "delta" + std::to_string(np);
    const auto copy_run = run_command(run(dir, np, 0, copy, "--sync.transport=copy"));
    ASSERT_EQ(copy_run.exit_code, 0) << copy_run.output;
    const auto delta = run_command(run(dir, np, 0, name, "--sync.transport=disk-delta " + options));
    ASSERT_EQ(delta.exit_code, 0) << delta.output;
    expect_disk_delta_run_matches_copy(dir, copy, name, np, false);
  }
}

// With rollout ranks: 2 trainer ranks and 1 rollout rank (-np 3, xor, from the initial
// weights) or 2 (-np 4, overwrite, from sync.baseline) take the steps of 2 colocated ranks
// with the copy transport, and the trainers' versions decode to their weights.
TEST(CliDiskDelta, RolloutRanksReproduceColocatedAndDecodeToTheTrainersWeights) {
  TempDir dir;
  tandem::testing::write_disk_delta_inputs(dir);
  const auto colocated = run_command(run(dir, 2, 0, "colocated", "--sync.transport=copy"));
  ASSERT_EQ(colocated.exit_code, 0) << colocated.output;
  for (const auto& [rollout_ranks, options] : {std::pair<int, std::string>{1, ""},
                                               {2, "--sync.delta-encoding=overwrite --sync.baseline=" + (dir / "model").string()}}) {
    SCOPED_TRACE(rollout_ranks);
    const std::string name = "split" + std::to_string(rollout_ranks);
    const auto split = run_command(run(dir, 2, rollout_ranks, name, "--sync.transport=disk-delta " + options));
    ASSERT_EQ(split.exit_code, 0) << split.output;
    expect_disk_delta_run_matches_copy(dir, "colocated", name, 2, true);
  }
}

// Each class of baseline error, in a tensor of source rank 1's share only, colocated (3
// ranks) and with a rollout rank (3 trainer ranks and 1 rollout rank): every rank stops
// together (within the time limit), non-zero, with rank 1's message in the log. (A
// tensor whose bytes disagree with its dtype and shape, the layout class, is refused by
// the safetensors reader of every rank that opens the file; baseline_mismatch's own
// layout check is in test_delta_format.cpp.)
TEST(CliDiskDelta, BaselineErrorOnOneRankStopsEveryRankWithItsMessage) {
  TempDir dir;
  const ModelConfig config = tandem::testing::write_disk_delta_inputs(dir);
  const ParameterLayout layout(config);
  const std::string tensor = layout.tensors()[1].name;  // dealt to rank 1 of 3
  struct Case {
    std::string name, expected;
    std::function<void(SafetensorsTensor&, std::vector<std::byte>&)> change;
  };
  std::vector<int64_t> shape = layout.tensors()[1].shape;
  std::vector<int64_t> doubled = shape;
  doubled[0] *= 2;
  const auto text = [](const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  const std::vector<Case> cases = {
      {"shape", "disk-delta baseline: rank 1: tensor " + tensor + ": shape " + text(doubled) + " in the baseline, " + text(shape) + " in the trainer",
       [&](SafetensorsTensor& t, std::vector<std::byte>& data) {
         t.shape = doubled;
         data.resize(data.size() * 2);
       }},
      {"dtype", "disk-delta baseline: rank 1: tensor " + tensor + ": dtype F16 in the baseline, F32 in the trainer",
       [](SafetensorsTensor& t, std::vector<std::byte>& data) {
         t.dtype = DType::F16;
         data.resize(data.size() / 2);
       }},
      {"missing", "disk-delta baseline: rank 1: tensor " + tensor + ": missing from the baseline",
       [](SafetensorsTensor& t, std::vector<std::byte>&) { t.name.clear(); }},
  };
  for (const Case& c : cases) {
    write_wrong_baseline(dir / "model", dir / ("baseline-" + c.name), tensor, c.change);
    for (const int rollout_ranks : {0, 1}) {
      SCOPED_TRACE(c.name + ", " + std::to_string(rollout_ranks) + " rollout ranks");
      const std::string name = c.name + std::to_string(rollout_ranks);
      const auto result = run_command(
          run(dir, 3, rollout_ranks, name, "--sync.transport=disk-delta --sync.baseline=" + (dir / ("baseline-" + c.name)).string()));
      EXPECT_NE(result.exit_code, 0) << result.output;
      EXPECT_NE(result.exit_code, 124) << "timed out: a rank hung\n" << result.output;
      EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
      for (const char* other : {"baseline: rank 0:", "baseline: rank 2:", "baseline: rank 3:"})
        EXPECT_EQ(result.output.find(other), std::string::npos) << other << "\n" << result.output;
      EXPECT_NE(tandem::testing::read_text(dir / name / "tandem.log").find(c.expected), std::string::npos);
      EXPECT_FALSE(fs::exists(delta_version_folder(dir / name / "weights", 1)));
    }
  }
}

// A corrupt delta file, caught by the rollout rank's checksums. The rollout rank runs in
// another folder (mpirun's --wdir) and reads a relative sync.path there: a copy of version
// 1 of an earlier run, whose checksum of one tensor of source rank 1's file is altered.
// Every rank stops together with the rollout rank's message naming the tensor, the file,
// the source rank and itself.
TEST(CliDiskDelta, ACorruptFileIsCaughtByTheRolloutRanksChecksums) {
  TempDir dir;
  const ModelConfig config = tandem::testing::write_disk_delta_inputs(dir);
  const std::string tensor = ParameterLayout(config).tensors()[1].name;  // source rank 1's of 2
  const std::string options = "--sync.transport=disk-delta --sync.path=weights --run.steps=1";
  for (const char* side : {"trainers/weights", "rollout/weights"}) fs::create_directories(dir / side);
  const auto first = run_command("cd " + (dir / "trainers").string() + " && " + run(dir, 2, 1, "first", options));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const fs::path version = delta_version_folder(dir / "rollout" / "weights", 1);
  fs::copy(delta_version_folder(dir / "trainers" / "weights", 1), version);
  const fs::path file = version / delta_file_name(1, 2);
  std::string bytes = tandem::testing::read_text(file);
  // The tensor's metadata, a JSON string in the header: {\"changed_bytes\": ..., \"xxh3_128\":\"<hex>\"}.
  const size_t metadata = bytes.find("\"" + tensor + "\":\"{");
  ASSERT_NE(metadata, std::string::npos);
  const size_t digit = bytes.find("xxh3_128", metadata) + std::string("xxh3_128\\\":\\\"").size();
  bytes[digit] = bytes[digit] == '0' ? '1' : '0';
  std::ofstream(file, std::ios::binary) << bytes;

  const std::string command = tandem::testing::disk_delta_run(dir, "corrupt", "cpu", 2, options + " --world.rollout-ranks=1");
  const auto result = run_command(mpirun(2) + "--wdir " + (dir / "trainers").string() + " " + command + " : -np 1 --wdir " +
                                  (dir / "rollout").string() + " " + command);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  const std::string expected = "disk-delta engine: rank 2: tensor " + tensor + " in " + (fs::path("weights") / "weight_v000001" / delta_file_name(1, 2)).string() +
                               " (source rank 1): checksum mismatch";
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("MPI_ABORT"), std::string::npos) << result.output;
}

// A full disk while the ranks write version 2, the first step's (version 1, the start's,
// holds zero deltas): a small tmpfs as sync.path (needs the right to mount, as root in the
// CI container), colocated and with a rollout rank. The job stops with the cause named,
// and nothing of the version is left: no index, no files.
TEST(CliDiskDelta, FullDiskWhileWritingPublishesNothing) {
  TempDir dir;
  tandem::testing::write_disk_delta_inputs(dir);
  const fs::path disk = dir / "small-disk";
  fs::create_directories(disk);
  if (run_command("mount -t tmpfs -o size=256k tmpfs " + disk.string() + " 2>&1").exit_code != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here";
  struct Unmount {
    fs::path path;
    ~Unmount() { run_command("umount " + path.string()); }
  } unmount{disk};
  for (const auto& [trainers, rollout_ranks] : {std::pair{3, 0}, std::pair{2, 1}}) {
    SCOPED_TRACE(std::to_string(rollout_ranks) + " rollout ranks");
    const auto result = run_command(
        run(dir, trainers, rollout_ranks, "full" + std::to_string(rollout_ranks), "--sync.transport=disk-delta --sync.path=" + disk.string()));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.exit_code, 124) << "timed out: a rank hung\n" << result.output;
    EXPECT_NE(result.output.find("disk-delta publish of " + delta_version_folder(disk, 2).string()), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
    EXPECT_FALSE(fs::exists(delta_version_folder(disk, 2))) << "a half-written version was left";
    EXPECT_EQ(read_delta_index(delta_version_folder(disk, 1)).version, 1);
  }
}
