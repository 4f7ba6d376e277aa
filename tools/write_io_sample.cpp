// Writes a small run folder with known contents, for checking the files with other
// readers:  write_io_sample /tmp/sample && python3 tools/check_h5py.py /tmp/sample
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/run_file.h"
#include "world/version.h"

using namespace tandem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <new folder>\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path folder = argv[1];
    std::filesystem::create_directories(folder);

    RunInfo info;
    info.deck_text = "[train]\nsteps = 3\n";
    info.version = tandem::tandem_version();
    info.git_revision = tandem::tandem_git_revision();
    info.ranks = 1;
    info.devices = {"cpu"};
    info.started_at = "2025-01-01T00:00:00Z";
    const RunFile run = RunFile::create(folder / kRunFileName, info);
    run.append_metrics(1, {{"reward_mean", 0.25}, {"loss", 1.5}});
    run.append_metrics(2, {{"reward_mean", 0.5}, {"loss", 1.25}});
    run.append_metrics(3, {{"reward_mean", 0.75}, {"kl", 0.125}});  // loss NaN, kl back-filled

    // The values check_h5py.py expects: bf16 and f16 1, -2, 0.5, 3.140625.
    uint16_t bf16[4] = {0x3F80, 0xC000, 0x3F00, 0x4049};
    uint16_t f16[4] = {0x3C00, 0xC000, 0x3800, 0x4248};
    uint8_t mask[4] = {1, 0, 0, 1};
    float weights[2][3] = {{1, 2, 3}, {4, 5, 6}};
    CheckpointContents contents;
    contents.step = 3;
    contents.data_cursor = 300;
    contents.deck_text = info.deck_text;
    contents.rng_states = {"rank0 state"};
    contents.tensors = {{"sample/bf16", Tensor::view(bf16, DType::BF16, Device::CPU, {4})},
                        {"sample/f16", Tensor::view(f16, DType::F16, Device::CPU, {4})},
                        {"sample/mask", Tensor::view(mask, DType::BOOL, Device::CPU, {4})},
                        {"layers.0.wq", Tensor::view(weights, DType::F32, Device::CPU, {2, 3})}};
    const auto path = write_checkpoint(folder, contents, 1);
    std::printf("wrote %s and %s\n", (folder / kRunFileName).c_str(), path.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "write_io_sample: %s\n", error.what());
    return 1;
  }
  return 0;
}
