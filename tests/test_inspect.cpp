// `tandem inspect` on what a short CPU run leaves (its run file and a checkpoint), on a
// truncated checkpoint, on a checkpoint holding a NaN, and on files that are not tandem's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cmath>
#include <sstream>

#include "io/checkpoint.h"
#include "io/hdf5_file.h"
#include "io/run_file.h"
#include "support.h"

namespace tandem {
namespace {

using nlohmann::json;
using testing::run_command;
using testing::TempDir;

testing::CommandResult inspect(const std::string& args) {
  return run_command(testing::tandem_binary() + " inspect " + args);
}

// One short run shared by the tests: 2 steps, samples and a checkpoint at step 2.
class Inspect : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tandem-inspect");
    const auto result = run_command("OMP_NUM_THREADS=1 " + testing::tandem_binary() +
                                    " --world.device=cpu --run.output-dir=" + dir_->path().string() +
                                    " --run.name=r --run.steps=2 --sft.steps=1 --model.layers=1"
                                    " --run.checkpoint-every=2 --run.samples-every=2 --grpo.kl-coef=0.05");
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::filesystem::path folder() { return dir_->path() / "r"; }
  static std::filesystem::path checkpoint() { return folder() / checkpoint_file_name(2); }
  static TempDir* dir_;
};
TempDir* Inspect::dir_ = nullptr;

TEST_F(Inspect, RunFileShowsTheRunItsMetricsPhasesMemoryAndSampleSteps) {
  const auto text = inspect((folder() / kRunFileName).string());
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const char* expected : {"steps done 2 (1 to 2)", "samples at steps 2", "[grpo]", "reward_mean", "time per phase",
                               "rollout", "peak memory per tag", "kv_cache"})
    EXPECT_NE(text.output.find(expected), std::string::npos) << expected << "\n" << text.output;

  const auto as_json = inspect((folder() / kRunFileName).string() + " --json --metrics loss,kl --last 1");
  ASSERT_EQ(as_json.exit_code, 0) << as_json.output;
  const json report = json::parse(as_json.output);
  const RunFile run = RunFile::open(folder() / kRunFileName);
  EXPECT_EQ(report["kind"], "run");
  EXPECT_EQ(report["ranks"], 1);
  EXPECT_EQ(report["deck"], run.info().deck_text);
  EXPECT_EQ(report["sample_steps"], json::array({2}));
  ASSERT_EQ(report["metrics"]["rows"].size(), 1u);
  EXPECT_EQ(report["metrics"]["rows"][0]["step"], 2);
  EXPECT_EQ(report["metrics"]["rows"][0]["loss"].get<double>(), run.metric("loss").back());
  EXPECT_GT(report["phase_seconds"]["train"]["total_s"].get<double>(), 0);

  const auto csv = inspect((folder() / kRunFileName).string() + " --csv --metrics loss,kl --last 5");
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  std::istringstream lines(csv.output);
  std::string header, first;
  std::getline(lines, header);
  std::getline(lines, first);
  EXPECT_EQ(header, "step,loss,kl");
  EXPECT_EQ(first.substr(0, 2), "1,");

  const auto unknown = inspect((folder() / kRunFileName).string() + " --metrics no_such_metric");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("no metric 'no_such_metric'"), std::string::npos) << unknown.output;
}

TEST_F(Inspect, SamplesCarryEntropyReferenceLogprobsAndPieces) {
  const auto samples = RunFile::open(folder() / kRunFileName).samples(2);
  ASSERT_FALSE(samples.empty());
  for (const SampleRecord& sample : samples) {
    const size_t n = sample.completion_tokens.size();
    EXPECT_EQ(sample.entropy.size(), n);
    EXPECT_EQ(sample.reference_logp.size(), n) << "grpo.kl-coef > 0: the reference's log-probs are kept";
    EXPECT_EQ(sample.completion_pieces.size(), n);
    EXPECT_EQ(sample.prompt_pieces.size(), sample.prompt_tokens.size());
    std::string joined;
    for (const auto& piece : sample.prompt_pieces) joined += piece;
    EXPECT_NE(joined.find(sample.prompt_text.substr(0, 3)), std::string::npos) << joined << " | " << sample.prompt_text;
    for (const float h : sample.entropy) EXPECT_TRUE(std::isfinite(h) && h >= 0) << h;
  }
}

TEST_F(Inspect, CheckpointListsEveryTensorWithNormAndChecksum) {
  const auto result = inspect(checkpoint().string() + " --json --verify");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const json report = json::parse(result.output);
  const Checkpoint stored = Checkpoint::open(checkpoint());
  EXPECT_EQ(report["kind"], "checkpoint");
  EXPECT_EQ(report["step"], 2);
  EXPECT_EQ(report["data_cursor"], stored.data_cursor());
  EXPECT_TRUE(report["verify"]["ok"].get<bool>());
  ASSERT_EQ(report["tensors"].size(), stored.tensors().size());
  for (size_t i = 0; i < stored.tensors().size(); ++i) {
    const hdf5::TensorInfo& info = stored.tensors()[i];
    const json& entry = report["tensors"][i];
    ASSERT_EQ(entry["name"], info.name);
    EXPECT_EQ(entry["shape"], info.shape);
    ASSERT_EQ(info.dtype, DType::F32);
    int64_t count = 1;
    for (int64_t extent : info.shape) count *= extent;
    std::vector<float> values(static_cast<size_t>(count));
    stored.read_tensor(info.name, Tensor::view(values.data(), DType::F32, Device::CPU, info.shape));
    double squares = 0;
    for (const float v : values) squares += double(v) * v;
    EXPECT_NEAR(entry["norm"].get<double>(), std::sqrt(squares), 1e-9 * (1 + std::sqrt(squares))) << info.name;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(values.data(), values.size() * sizeof(float))));
    EXPECT_EQ(entry["xxh3"], hex) << info.name;
  }
  const auto text = inspect(checkpoint().string());
  EXPECT_NE(text.output.find("step 2, data cursor"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("master.model.norm.weight"), std::string::npos);
}

TEST_F(Inspect, TruncatedCheckpointIsDamaged) {
  TempDir dir("tandem-inspect");
  const std::filesystem::path copy = dir / "ckpt_00000002.h5";
  std::filesystem::copy_file(checkpoint(), copy);
  std::filesystem::resize_file(copy, std::filesystem::file_size(copy) / 2);
  const auto result = inspect(copy.string() + " --verify");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("truncated"), std::string::npos) << result.output;
}

TEST(InspectFile, ANonFiniteTensorFailsVerifyByName) {
  TempDir dir("tandem-inspect");
  std::vector<float> good = {1, 2, 3}, bad = {1, NAN, 3};
  CheckpointContents contents{7, 70, "[run]\n", {"rng"}, {}};
  contents.tensors.push_back({"a.good", Tensor::view(good.data(), DType::F32, Device::CPU, {3})});
  contents.tensors.push_back({"b.bad", Tensor::view(bad.data(), DType::F32, Device::CPU, {3})});
  const std::filesystem::path path = write_checkpoint(dir.path(), contents, 0);
  const auto result = inspect(path.string() + " --verify");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("tensor 'b.bad' holds NaN or Inf"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("'a.good' holds"), std::string::npos);
  EXPECT_EQ(inspect(path.string()).exit_code, 0) << "without --verify the listing shows the NaN's norm and succeeds";
}

TEST(InspectFile, MemoryPerTagTakesOnlyTagPeaks) {
  TempDir dir("tandem-inspect");
  const RunFile run = RunFile::create(dir / "run.h5", RunInfo{"[run]\n", "v", "r", 1, {"cpu"}, "now"});
  run.append_metrics(1, {{"memory/device_peak", 300}, {"memory/kv_cache/device_peak", 200}, {"memory/kv_cache/host_peak", 5},
                         {"memory/phase/rollout/device_pool_peak", 250}, {"time/rollout", 1.5}});
  run.append_metrics(2, {{"memory/device_peak", 100}, {"memory/kv_cache/device_peak", 400}, {"time/rollout", 0.5}});
  const auto result = inspect((dir / "run.h5").string() + " --json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const json report = json::parse(result.output);
  const json expected = {{"(all)", {{"device_peak_bytes", 300.0}}},
                         {"kv_cache", {{"device_peak_bytes", 400.0}, {"host_peak_bytes", 5.0}}}};
  EXPECT_EQ(report["memory_peak"], expected) << "the per-phase peak is no tag";
  EXPECT_EQ(report["phase_seconds"]["rollout"]["total_s"], 2.0);
  EXPECT_EQ(report["phase_seconds"]["rollout"]["mean_s"], 1.0);
  EXPECT_EQ(report["sample_steps"], json::array());
}

TEST(InspectFile, GarbageAndForeignHdf5AreOneLineAndExitTwo) {
  TempDir dir("tandem-inspect");
  testing::write_text(dir / "garbage.h5", std::string(4096, '\x5a'));
  const auto garbage = inspect((dir / "garbage.h5").string());
  EXPECT_EQ(garbage.exit_code, 2);
  EXPECT_EQ(garbage.output, "tandem inspect: " + (dir / "garbage.h5").string() +
                                ": not an HDF5 file, so neither a tandem run file nor a checkpoint\n");
  {
    hdf5::File foreign = hdf5::File::create(dir / "foreign.h5");
    foreign.set_attribute("format", std::string("something else"));
    foreign.close();
  }
  const auto foreign = inspect((dir / "foreign.h5").string());
  EXPECT_EQ(foreign.exit_code, 2);
  EXPECT_NE(foreign.output.find("not a tandem run file or checkpoint (format attribute 'something else')"),
            std::string::npos)
      << foreign.output;
  EXPECT_EQ(std::count(foreign.output.begin(), foreign.output.end(), '\n'), 1);
  EXPECT_EQ(inspect((dir / "missing.h5").string()).exit_code, 2);
  EXPECT_EQ(inspect("").exit_code, 2) << "no file given";
}

}  // namespace
}  // namespace tandem
