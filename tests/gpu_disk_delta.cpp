// disk-delta on a GPU in BF16: its baseline (the initial weights) is rounded to BF16 on
// the host, its versions and the copy transport's weights on the device. The roundings
// must agree bit for bit, so a disk-delta run's metrics equal a copy run's, and the newest
// version decodes to the BF16 rounding of the final master weights.
#include <gtest/gtest.h>

#include <cstring>

#include "disk_delta_support.h"
#include "gpu_support.h"
#include "io/checkpoint.h"
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

  // The baseline: the engines' first weights, the BF16 rounding of the model folder's.
  const SafetensorsCheckpoint model(dir / "model");
  TempDir rounded;
  std::vector<std::vector<std::byte>> bytes;
  std::vector<SafetensorsTensor> tensors;
  bytes.reserve(model.names().size());
  for (const std::string& name : model.names()) {
    bytes.push_back(to_bf16(model.file_of(name)->bytes(name)));
    tensors.push_back({name, DType::BF16, model.file_of(name)->entry(name).shape, bytes.back().data()});
  }
  write_safetensors(rounded / kSafetensorsSingleName, tensors);
  const SafetensorsCheckpoint baseline(rounded.path());
  const auto decoded = decode_version(delta_version_folder(dir / "disk-delta" / "weights", kDiskDeltaNewestVersion), baseline);
  const Checkpoint checkpoint = Checkpoint::open(dir / "disk-delta" / checkpoint_file_name(kDiskDeltaSteps));
  for (const auto& [tensor, state] : decoded) {
    const auto& shape = model.file_of(tensor)->entry(tensor).shape;
    std::vector<std::byte> master(state.size() * 2);
    checkpoint.read_tensor("master." + tensor, Tensor::view(master.data(), DType::F32, Device::CPU, shape));
    EXPECT_TRUE(to_bf16(master) == state) << tensor;
  }
}
