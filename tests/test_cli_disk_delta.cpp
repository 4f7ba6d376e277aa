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
using tandem::testing::apply_version;
using tandem::testing::master_weights;
using tandem::testing::TensorBytes;
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
// every metric but the transport's own (and the handoffs', which rollout ranks have none of)
// is equal; each step publishes a version, and the last two are kept, each with a file per
// source rank. Version v is a delta against v - 1 (a rolling baseline): applied onto step v
// - 1's master weights (FP32 on the CPU: the checkpoint's) it gives step v's bit for bit,
// and its changed bytes and the step's density are step v's change alone; the newest
// version applied onto the baseline does not decode (xor).
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
  const SafetensorsCheckpoint model(dir / "model");
  EXPECT_FALSE(fs::exists(delta_version_folder(weights, kDiskDeltaNewestVersion - 2)));
  for (int version = kDiskDeltaNewestVersion - 1; version <= kDiskDeltaNewestVersion; ++version) {
    SCOPED_TRACE("version " + std::to_string(version));
    const fs::path folder = delta_version_folder(weights, version);
    const DeltaIndex index = read_delta_index(folder);
    EXPECT_EQ(index.version, version);
    EXPECT_EQ(index.base_version, version - 1);
    for (int r = 0; r < sources; ++r) EXPECT_TRUE(fs::exists(folder / delta_file_name(r, sources))) << r;
    EXPECT_FALSE(fs::exists(folder / delta_file_name(sources, sources + 1)));
    TensorBytes state = master_weights(dir / name, version - 1, model);
    const TensorBytes expected = master_weights(dir / name, version, model);
    size_t differing = 0, total = 0;
    for (const auto& [tensor, bytes] : expected) {
      total += bytes.size();
      for (size_t k = 0; k < bytes.size(); ++k) differing += bytes[k] != state.at(tensor)[k];
    }
    EXPECT_EQ(apply_version(folder, state), differing);
    EXPECT_NEAR(density[version - 1], static_cast<double>(differing) / static_cast<double>(total), 1e-9);
    for (const auto& [tensor, bytes] : expected) EXPECT_TRUE(state.at(tensor) == bytes) << tensor;
    if (index.encoding == DeltaEncoding::Xor && version == kDiskDeltaNewestVersion) {
      TensorBytes baseline = tandem::testing::tensor_bytes(model);
      EXPECT_THROW(apply_version(folder, baseline), std::runtime_error);
    }
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

// What a rollout rank reads that is not what the trainers wrote, caught by it: the rollout
// rank runs in another folder (mpirun's --wdir) and reads a relative sync.path there,
// where version 1 is prepared from an earlier run's versions: (a) its version 1 with the
// checksum of one tensor of source rank 1's file altered, (b) its version 2, a delta
// against version 1, renumbered 1 (an engine that missed a version). Every rank stops
// together with the rollout rank's message naming it and the file.
TEST(CliDiskDelta, ACorruptFileOrAWrongBaseIsCaughtByTheRolloutRank) {
  TempDir dir;
  const ModelConfig config = tandem::testing::write_disk_delta_inputs(dir);
  const std::string tensor = ParameterLayout(config).tensors()[1].name;  // source rank 1's of 2
  const std::string options = "--sync.transport=disk-delta --sync.path=weights --sync.keep-versions=2 --world.rollout-ranks=1";
  fs::create_directories(dir / "earlier" / "weights");
  const auto earlier = run_command("cd " + (dir / "earlier").string() + " && " + mpirun(3) +
                                   tandem::testing::disk_delta_run(dir, "earlier", "cpu", 2, options + " --run.steps=2"));
  ASSERT_EQ(earlier.exit_code, 0) << earlier.output;
  const fs::path written = dir / "earlier" / "weights";
  const std::string index = (fs::path("weights") / "weight_v000001" / kSafetensorsIndexName).string();
  const std::string file = (fs::path("weights") / "weight_v000001" / delta_file_name(1, 2)).string();
  struct Case {
    std::string name;
    std::function<void(const fs::path& version)> prepare;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"checksum",
       [&](const fs::path& version) {
         fs::copy(delta_version_folder(written, 1), version);
         const fs::path path = version / delta_file_name(1, 2);
         std::string bytes = tandem::testing::read_text(path);
         // The tensor's metadata, a JSON string in the header: {\"changed_bytes\": ..., \"xxh3_128\":\"<hex>\"}.
         const size_t metadata = bytes.find("\"" + tensor + "\":\"{");
         ASSERT_NE(metadata, std::string::npos);
         const size_t digit = bytes.find("xxh3_128", metadata) + std::string("xxh3_128\\\":\\\"").size();
         bytes[digit] = bytes[digit] == '0' ? '1' : '0';
         std::ofstream(path, std::ios::binary) << bytes;
       },
       "disk-delta engine: rank 2: tensor " + tensor + " in " + file + " (source rank 1): checksum mismatch"},
      {"base",
       [&](const fs::path& version) {
         fs::copy(delta_version_folder(written, 2), version);
         DeltaIndex renumbered = read_delta_index(version);
         renumbered.version = 1;
         write_delta_index(version, renumbered);
       },
       "disk-delta engine: rank 2: " + index + ": version 1 is a delta against version 1; this engine holds version 0 and expects version 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path trainers = dir / c.name / "trainers", rollout = dir / c.name / "rollout";
    for (const fs::path& side : {trainers, rollout}) fs::create_directories(side / "weights");
    c.prepare(delta_version_folder(rollout / "weights", 1));
    const std::string command = tandem::testing::disk_delta_run(dir, c.name, "cpu", 2, options + " --run.steps=1");
    const auto result = run_command(mpirun(2) + "--wdir " + trainers.string() + " " + command + " : -np 1 --wdir " + rollout.string() + " " + command);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("MPI_ABORT"), std::string::npos) << result.output;
  }
}

// A resumed run: the first sync of the second job finds the trainer's weights (the step-2
// checkpoint's) unlike the baseline and publishes them as version 1 against it; the next
// step's version is against that. A fresh run's first sync published nothing.
TEST(CliDiskDelta, AResumedRunPublishesItsWeightsAtTheFirstSync) {
  TempDir dir;
  tandem::testing::write_disk_delta_inputs(dir);
  const SafetensorsCheckpoint model(dir / "model");
  const fs::path weights = dir / "resumed" / "weights";
  const auto first = run_command(run(dir, 1, 1, "resumed", "--sync.transport=disk-delta --sync.keep-versions=3 --run.steps=2"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(read_delta_index(delta_version_folder(weights, 2)).base_version, 1);
  EXPECT_FALSE(fs::exists(delta_version_folder(weights, 3)));
  const auto second = run_command(run(dir, 1, 1, "resumed", "--sync.transport=disk-delta --sync.keep-versions=3"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_FALSE(fs::exists(delta_version_folder(weights, 3))) << "the first job's versions are gone";
  TensorBytes state = tandem::testing::tensor_bytes(model);
  EXPECT_EQ(read_delta_index(delta_version_folder(weights, 1)).base_version, 0);
  apply_version(delta_version_folder(weights, 1), state);
  EXPECT_TRUE(state == master_weights(dir / "resumed", 2, model));
  apply_version(delta_version_folder(weights, 2), state);
  EXPECT_TRUE(state == master_weights(dir / "resumed", 3, model));
}

// A full disk while the ranks write a version: a small tmpfs as sync.path (needs the right
// to mount, as root in the CI container), colocated and with a rollout rank. The job stops
// with the cause named, nothing of the version is left (no index, no files), and the
// version before it, if any, is whole.
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
    const std::string publish = "disk-delta publish of " + (disk / "weight_v").string();
    const size_t at = result.output.find(publish);
    ASSERT_NE(at, std::string::npos) << result.output;
    const int version = std::stoi(result.output.substr(at + publish.size(), 6));
    EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
    EXPECT_FALSE(fs::exists(delta_version_folder(disk, version))) << "a half-written version was left";
    if (version > 1) EXPECT_EQ(read_delta_index(delta_version_folder(disk, version - 1)).version, version - 1);
  }
}
