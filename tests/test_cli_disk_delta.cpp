// sync.transport = disk-delta as the user runs it, under mpirun: every rank writes its
// share of each version and every engine reads all of them. The published versions decode
// back to the trainer's weights bit for bit, the run's metrics are a copy-transport run's,
// and a wrong baseline on one rank's share stops every rank together with its message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <set>

#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/safetensors.h"
#include "model/parameters.h"
#include "support.h"
#include "sync/delta_format.h"
#include "tiny_hf_folder.h"

using namespace tandem;
using tandem::testing::run_command;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 3;

std::string mpirun(int np) {
  return std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 timeout 120 mpirun --oversubscribe ") +
         (getuid() == 0 ? "--allow-run-as-root " : "") + "-np " + std::to_string(np) + " ";
}

// A tiny pretrained model and prompts in dir; a short run on them.
ModelConfig write_inputs(const TempDir& dir) {
  const ModelConfig config = tandem::testing::write_tiny_hf_model(dir / "model");
  tandem::testing::write_text(dir / "prompts.jsonl",
                              "{\"prompt\": \"What is 2+3?\", \"answer\": 5}\n{\"prompt\": \"What is 7-4?\", \"answer\": 3}\n"
                              "{\"prompt\": \"What is 1+1?\", \"answer\": 2}\n{\"prompt\": \"What is 9-2?\", \"answer\": 7}\n");
  return config;
}

std::string run(const TempDir& dir, int np, const std::string& name, const std::string& extra) {
  return mpirun(np) + tandem::testing::tandem_binary() + " --world.device=cpu --run.output-dir=" + dir.path().string() +
         " --run.name=" + name + " --model.path=" + (dir / "model").string() + " --task.name=jsonl --task.path=" +
         (dir / "prompts.jsonl").string() + " --task.reward=last-number --task.prompts-per-step=" + std::to_string(np) +
         " --grpo.group-size=2 --grpo.max-new-tokens=4 --grpo.lr=1e-3 --sft.steps=0 --run.steps=" + std::to_string(kSteps) +
         " --run.checkpoint-every=" + std::to_string(kSteps) + " " + extra + " 2>&1";
}

// The weights a published version decodes to: the baseline with every file of the index applied.
std::map<std::string, std::vector<std::byte>> decode_version(const fs::path& folder, const SafetensorsCheckpoint& baseline) {
  const DeltaIndex index = read_delta_index(folder);
  std::map<std::string, std::vector<std::byte>> weights;
  DeltaApplyTarget target;
  target.baseline = [&](const std::string& name, DType, const std::vector<int64_t>&) { return baseline.file_of(name)->bytes(name); };
  target.apply = [&](const std::string& name, std::span<const std::byte> state) { weights[name].assign(state.begin(), state.end()); };
  std::set<std::string> files;
  for (const auto& [tensor, file] : index.weight_map) files.insert(file);
  for (const std::string& file : files) apply_delta_file(folder / file, index.encoding, target);
  EXPECT_EQ(weights.size(), index.weight_map.size());
  return weights;
}

bool is_transport_specific(const std::string& metric) {
  for (const char* prefix : {"sync/", "time/", "memory/"})
    if (metric.rfind(prefix, 0) == 0) return true;
  const auto ends_with = [&](const std::string& tail) {
    return metric.size() >= tail.size() && metric.compare(metric.size() - tail.size(), tail.size(), tail) == 0;
  };
  return metric.find("_per_s") != std::string::npos || ends_with("seconds");  // timings differ run to run
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
  write_inputs(dir);
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
    ASSERT_EQ(density.size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_GT(density[s], 0) << s;
      EXPECT_LE(density[s], 1) << s;
      EXPECT_GT(wire[s], 0) << s;
    }

    // keep-versions = 2: the last two versions, each complete, the older deleted.
    const fs::path weights = dir / name / "weights";
    EXPECT_FALSE(fs::exists(delta_version_folder(weights, kSteps - 2)));
    const DeltaIndex index = read_delta_index(delta_version_folder(weights, kSteps));
    EXPECT_EQ(index.version, kSteps);
    EXPECT_EQ(index.base_version, 0);
    for (int r = 0; r < np; ++r) EXPECT_TRUE(fs::exists(delta_version_folder(weights, kSteps) / delta_file_name(r, np))) << r;
    decode_version(delta_version_folder(weights, kSteps - 1), baseline);
    const auto decoded = decode_version(delta_version_folder(weights, kSteps), baseline);
    const Checkpoint checkpoint = Checkpoint::open(dir / name / checkpoint_file_name(kSteps));
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
  const ModelConfig config = write_inputs(dir);
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
  write_inputs(dir);
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
