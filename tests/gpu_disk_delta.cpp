// disk-delta on a GPU in BF16: its baseline (the initial weights) is rounded to BF16 on
// the host, its versions and the copy transport's weights on the device. The roundings
// must agree bit for bit, so a disk-delta run's metrics equal a copy run's, and the newest
// version, applied onto the rounding of the previous step's master weights, decodes to the
// rounding of the final ones.
#include <gtest/gtest.h>

#include <cstring>

#include "disk_delta_support.h"
#include "gpu_support.h"
#include "io/run_file.h"
#include "tensor/bf16.h"

using namespace tandem;
using namespace tandem::testing;
namespace fs = std::filesystem;

namespace {

// The BF16 rounding of an F32 tensor's bytes.
std::vector<std::byte> to_bf16(std::span<const std::byte> f32) {
  std::vector<std::byte> out(f32.size() / 2);
  for (size_t i = 0; i < f32.size() / 4; ++i) {
    float value;
    std::memcpy(&value, f32.data() + 4 * i, 4);
    const uint16_t rounded = float_to_bf16(value);
    std::memcpy(out.data() + 2 * i, &rounded, 2);
  }
  return out;
}

}  // namespace

TEST(GpuDiskDelta, Bf16RunMatchesCopyAndDecodesToTheMasterWeights) {
  REQUIRE_GPU();
  TempDir dir;
  write_disk_delta_inputs(dir);
  for (const std::string transport : {"copy", "disk-delta"}) {
    const auto result = run_command(disk_delta_run(dir, transport, "cuda", 1, "--model.dtype=bf16 --sync.transport=" + transport));
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  const RunFile copy = RunFile::open(dir / "copy" / kRunFileName), delta = RunFile::open(dir / "disk-delta" / kRunFileName);
  for (const std::string& metric : copy.metric_names())
    if (!is_transport_specific(metric)) EXPECT_EQ(copy.metric(metric), delta.metric(metric)) << metric;

  // The newest version is a delta against the one before: applied onto the BF16 rounding
  // of the previous step's master weights, it gives the rounding of the last step's.
  const SafetensorsCheckpoint model(dir / "model");
  TensorBytes state = master_weights(dir / "disk-delta", kDiskDeltaSteps - 1, model);
  for (auto& [tensor, bytes] : state) bytes = to_bf16(bytes);
  apply_version(delta_version_folder(dir / "disk-delta" / "weights", kDiskDeltaNewestVersion), state);
  for (const auto& [tensor, bytes] : master_weights(dir / "disk-delta", kDiskDeltaSteps, model))
    EXPECT_TRUE(to_bf16(bytes) == state.at(tensor)) << tensor;
}
