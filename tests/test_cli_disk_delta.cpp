// sync.transport = disk-delta as the user runs it, under mpirun: every rank writes its
// share of each version and every engine reads all of them. The published versions decode
// back to the trainer's weights bit for bit, the run's metrics are a copy-transport run's,
// and a wrong baseline on one rank's share stops every rank together with its message.
#include <gtest/gtest.h>
#include <unistd.h>


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
namespace fs = std::filesystem;

namespace {

std::string mpirun(int np) {
  return std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 timeout 120 mpirun --oversubscribe ") +
         (getuid() == 0 ? "--allow-run-as-root " : "") + "-np " + std::to_string(np) + " ";
}

std::string run(const TempDir& dir, int np, const std::string& name, const std::string& extra) {
  return mpirun(np) + tandem::testing::disk_delta_run(dir, name, "cpu", np, extra);
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

}  // namespace

// -np 3 from the engines' first weights (xor), -np 4 from the model folder as sync.baseline
// (overwrite): every metric but the transport's own equals the copy transport's, and the
// newest version decodes to the final checkpoint's master weights (FP32 on the CPU) bit for bit.
TEST(CliDiskDelta, VersionsDecodeToTheTrainersWeightsAndMetricsMatchCopy) {
  TempDir dir;
  tandem::testing::write_disk_delta_inputs(dir);
  const SafetensorsCheckpoint baseline(dir / "model");
  for (const auto& [np, options] : {std::pair<int, std::string>{3, ""},
                                    {4, "--sync.delta-encoding=overwrite --sync.baseline=" + (dir / "model").string()}}) {
    SCOPED_TRACE(np);
    const std::string name = "delta" + std::to_string(np);
    const auto copy = run_command(run(dir, np, "copy" + std::to_string(np), "--sync.transport=copy"));
    ASSERT_EQ(copy.exit_code, 0) << copy.output;
    const auto delta = run_command(run(dir, np, name, "--sync.transport=disk-delta " + options));
    ASSERT_EQ(delta.exit_code, 0) << delta.output;

    const RunFile copy_run = RunFile::open(dir / ("copy" + std::to_string(np)) / kRunFileName);
    const RunFile delta_run = RunFile::open(dir / name / kRunFileName);
    size_t compared = 0;
    for (const std::string& metric : copy_run.metric_names()) {
      if (is_transport_specific(metric)) continue;
      EXPECT_EQ(copy_run.metric(metric), delta_run.metric(metric)) << metric;
      ++compared;
    }
    EXPECT_GT(compared, 10u);
    const std::vector<double> density = delta_run.metric("sync/density"), wire = delta_run.metric("sync/wire_bytes");
    ASSERT_EQ(density.size(), static_cast<size_t>(tandem::testing::kDiskDeltaSteps));
    for (int s = 0; s < tandem::testing::kDiskDeltaSteps; ++s) {
      EXPECT_GT(density[s], 0) << s;
      EXPECT_LE(density[s], 1) << s;
      EXPECT_GT(wire[s], 0) << s;
    }

    // keep-versions = 2: the last two versions, each complete, the older deleted.
    const fs::path weights = dir / name / "weights";
    EXPECT_FALSE(fs::exists(delta_version_folder(weights, tandem::testing::kDiskDeltaSteps - 2)));
    const DeltaIndex index = read_delta_index(delta_version_folder(weights, tandem::testing::kDiskDeltaSteps));
    EXPECT_EQ(index.version, tandem::testing::kDiskDeltaSteps);
    EXPECT_EQ(index.base_version, 0);
    for (int r = 0; r < np; ++r) EXPECT_TRUE(fs::exists(delta_version_folder(weights, tandem::testing::kDiskDeltaSteps) / delta_file_name(r, np))) << r;
    decode_version(delta_version_folder(weights, tandem::testing::kDiskDeltaSteps - 1), baseline);
    const auto decoded = decode_version(delta_version_folder(weights, tandem::testing::kDiskDeltaSteps), baseline);
    const Checkpoint checkpoint = Checkpoint::open(dir / name / checkpoint_file_name(tandem::testing::kDiskDeltaSteps));
    ASSERT_EQ(decoded.size(), baseline.names().size());
    for (const auto& [tensor, bytes] : decoded) {
      const SafetensorsEntry& entry = baseline.file_of(tensor)->entry(tensor);
      std::vector<std::byte> master(bytes.size());
      checkpoint.read_tensor("master." + tensor, Tensor::view(master.data(), DType::F32, Device::CPU, entry.shape));
      EXPECT_TRUE(master == bytes) << tensor;
    }
  }
}

// Each class of baseline error, in a tensor of rank 1's share only (of 3): every rank
// stops together (within the time limit), non-zero, with rank 1's message in the log.
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
    SCOPED_TRACE(c.name);
    write_wrong_baseline(dir / "model", dir / ("baseline-" + c.name), tensor, c.change);
    const auto result = run_command(run(dir, 3, c.name, "--sync.transport=disk-delta --sync.baseline=" + (dir / ("baseline-" + c.name)).string()));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.exit_code, 124) << "timed out: a rank hung\n" << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("baseline: rank 0:"), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("baseline: rank 2:"), std::string::npos) << result.output;
    EXPECT_NE(tandem::testing::read_text(dir / c.name / "tandem.log").find(c.expected), std::string::npos);
    EXPECT_FALSE(fs::exists(delta_version_folder(dir / c.name / "weights", 1)));
  }
}

// A full disk while the ranks write version 1: a small tmpfs as sync.path (needs the right
// to mount, as root in the CI container). The job stops with the cause named, and nothing
// of the version is left: no index, no files.
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
  const auto result = run_command(run(dir, 3, "full", "--sync.transport=disk-delta --sync.path=" + disk.string()));
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, 124) << "timed out: a rank hung\n" << result.output;
  EXPECT_NE(result.output.find("disk-delta publish of " + delta_version_folder(disk, 1).string()), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(delta_version_folder(disk, 1))) << "a half-written version was left";
}
