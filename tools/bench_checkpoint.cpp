// Seconds per checkpoint and its rate against the disk: a checkpoint of `--mib` MiB of
// F32 tensors in the shapes of a model's layout (the master weights and AdamW's two
// moments of a Qwen3-like decoder scaled to the size asked), written and committed
// `--repeat` times into `--dir`, each one durable (fsynced) before the next, from one
// host buffer laid out as the background writer's snapshot. The peer figure is the
// disk's own: `dd if=/dev/zero of=DIR/x bs=1M count=N oflag=direct`.
//
//   bench_checkpoint [--mib 1024] [--repeat 3] [--dir D] [--hidden 1024]
//
// Prints one line per checkpoint and a summary line:
//   checkpoint <MiB> MiB in <T> tensors: <s> s, <GB/s> GB/s (median of <n>)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_args.h"
#include "io/checkpoint.h"
#include "model/parameters.h"
#include "world/pinned_memory.h"

using namespace tandem;

int main(int argc, char** argv) {
  const int mib = arg_int(argc, argv, "--mib", 1024);
  const int repeat = std::max(1, arg_int(argc, argv, "--repeat", 3));
  const int64_t hidden = arg_int(argc, argv, "--hidden", 1024);
  const std::filesystem::path folder =
      std::filesystem::path(arg_text(argc, argv, "--dir", std::filesystem::temp_directory_path().c_str())) /
      ("bench_checkpoint_" + std::to_string(::getpid()));

  // Per layer the seven projections of a Qwen3 block (3x intermediate) and two norms; the
  // embedding takes what is left of the size asked, so the tensor count stays realistic.
  const int64_t total_floats = static_cast<int64_t>(mib) * (1 << 20) / 4;
  // Three quarters in the layers (13 hidden^2 floats per layer and slab), as at 0.6B.
  const int layers = static_cast<int>(std::max<int64_t>(1, total_floats * 3 / 4 / (3 * 13 * hidden * hidden)));
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const char* slab : {"master.", "adamw.exp_avg.", "adamw.exp_avg_sq."}) {
    for (int l = 0; l < layers; ++l) {
      const std::string layer = std::string(slab) + "layers." + std::to_string(l) + ".";
      for (const char* name : {"q", "k", "v", "o"}) shapes.push_back({layer + name, {hidden, hidden}});
      for (const char* name : {"gate", "up", "down"}) shapes.push_back({layer + name, {3 * hidden, hidden}});
      for (const char* name : {"input_norm", "post_norm"}) shapes.push_back({layer + name, {hidden}});
    }
  }
  int64_t layer_floats = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t extent : shape) n *= extent;
    layer_floats += n;
  }
  const int64_t embed_rows = std::max<int64_t>(1, (total_floats - layer_floats) / 3 / hidden);
  for (const char* slab : {"master.", "adamw.exp_avg.", "adamw.exp_avg_sq."})
    shapes.push_back({std::string(slab) + "embed", {embed_rows, hidden}});

  // Laid out as the writer's snapshot is: one page-aligned buffer, each tensor at an
  // offset of the parameter layout's alignment, so the direct writes read it as they read
  // a snapshot (in place, or through their staging buffer where the disk wants more).
  std::vector<int64_t> offsets;
  int64_t floats = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t extent : shape) n *= extent;
    offsets.push_back(floats);
    floats += (n + ParameterLayout::kAlignment - 1) / ParameterLayout::kAlignment * ParameterLayout::kAlignment;
  }
  PinnedMemory snapshot(static_cast<size_t>(floats) * sizeof(float), Device::CPU);
  float* const base = static_cast<float*>(snapshot.data());
  CheckpointContents contents{0, 0, "[run]\n", {"rng"}, {}};
  size_t bytes = 0;
  for (size_t t = 0; t < shapes.size(); ++t) {
    const Tensor tensor = Tensor::view(base + offsets[t], DType::F32, Device::CPU, shapes[t].second);
    float* const values = base + offsets[t];
    for (int64_t i = 0; i < tensor.numel(); ++i) values[i] = static_cast<float>(i % 1000) * 1e-3f;
    contents.tensors.push_back({shapes[t].first, tensor});
    bytes += tensor.nbytes();
  }

  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    contents.step = r + 1;
    const auto start = std::chrono::steady_clock::now();
    write_checkpoint(folder, contents, 1);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::printf("checkpoint %d: %.3f s, %.3f GB/s\n", r + 1, seconds.back(), bytes / seconds.back() / 1e9);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::printf("checkpoint %.0f MiB in %zu tensors: %.3f s, %.3f GB/s (median of %d)\n", bytes / 1048576.0,
              contents.tensors.size(), median, bytes / median / 1e9, repeat);
  std::filesystem::remove_all(folder);
  return 0;
}
