// What the crash safety costs on the host: a metrics row appended to run.h5 (in place, as
// before), the durable copy of run.h5 taken with each checkpoint (run_file_copy.h), and
// the per-tensor checks of a checkpoint (XXH3 on write and read, the finite scan on load).
//
//   bench_run_file [--steps 1000] [--metrics 60] [--samples 128] [--samples-every 10] [--mib 256] [--dir D]
//
// --dir puts the run file where the runs go (the default is the temp folder, often tmpfs).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_args.h"
#include "io/checksum.h"
#include "io/run_file_copy.h"
#include "tensor/finite.h"

using namespace tandem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string arg_text(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = arg_int(argc, argv, "--steps", 1000);
  const int metric_count = arg_int(argc, argv, "--metrics", 60);
  const int sample_count = arg_int(argc, argv, "--samples", 128);
  const int samples_every = arg_int(argc, argv, "--samples-every", 10);
  const int mib = arg_int(argc, argv, "--mib", 256);
  const std::filesystem::path folder =
      std::filesystem::path(arg_text(argc, argv, "--dir", std::filesystem::temp_directory_path().string())) /
      ("bench_run_file_" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);

  const RunFile run = RunFile::create(folder / kRunFileName, RunInfo{"[run]\n", "bench", "-", 1, {"cpu"}, "now"});
  MetricValues metrics;
  for (int m = 0; m < metric_count; ++m) metrics.push_back({"metric_" + std::to_string(m), 0.0});
  std::vector<SampleRecord> samples(static_cast<size_t>(sample_count));
  for (SampleRecord& sample : samples) {
    sample.prompt_text = "What is 12+34? Answer with a number.";
    sample.completion_text = "46";
    sample.prompt_tokens.assign(128, 7);
    sample.completion_tokens.assign(256, 9);
    sample.rollout_logp.assign(256, -0.5f);
    sample.train_logp.assign(256, -0.5f);
  }
  double append_seconds = 0, samples_seconds = 0;
  for (int step = 1; step <= steps; ++step) {
    for (auto& [name, value] : metrics) value = step;
    auto start = std::chrono::steady_clock::now();
    run.append_metrics(step, metrics);
    append_seconds += seconds_since(start);
    if (samples_every > 0 && step % samples_every == 0) {
      start = std::chrono::steady_clock::now();
      run.append_samples(step, samples);
      samples_seconds += seconds_since(start);
    }
  }
  const double run_bytes = static_cast<double>(std::filesystem::file_size(folder / kRunFileName));
  auto start = std::chrono::steady_clock::now();
  save_run_file_copy(folder, steps);
  const double copy_seconds = seconds_since(start);

  std::vector<float> tensor(static_cast<size_t>(mib) << 18, 0.25f);  // mib MiB of F32
  const double bytes = static_cast<double>(tensor.size() * sizeof(float));
  start = std::chrono::steady_clock::now();
  const uint64_t checksum = xxh3_64(tensor.data(), tensor.size() * sizeof(float));
  const double hash_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  const bool finite = !first_non_finite(Tensor::view(tensor.data(), DType::F32, Device::CPU, {static_cast<int64_t>(tensor.size())}));
  const double scan_seconds = seconds_since(start);

  std::printf("run file: %d steps x %d metrics, %d samples every %d steps: %.1f MiB\n", steps, metric_count,
              sample_count, samples_every, run_bytes / (1 << 20));
  std::printf("  metrics row append       %8.3f ms/step (in place, unchanged by the crash safety)\n",
              1e3 * append_seconds / steps);
  std::printf("  samples append           %8.3f ms/append\n",
              samples_every > 0 ? 1e3 * samples_seconds / (steps / samples_every) : 0.0);
  std::printf("  durable copy of run.h5   %8.3f ms/checkpoint (%.2f GB/s, copy + fsync + rename)\n", 1e3 * copy_seconds,
              run_bytes / copy_seconds / 1e9);
  std::printf("checkpoint tensor checks on %d MiB: xxh3 %.2f GB/s, finite scan %.2f GB/s (%s, %016llx)\n", mib,
              bytes / hash_seconds / 1e9, bytes / scan_seconds / 1e9, finite ? "finite" : "not finite",
              static_cast<unsigned long long>(checksum));
  std::filesystem::remove_all(folder);
  return 0;
}
