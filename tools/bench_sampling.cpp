// Time per call of the GPU sampler (CudaSampler::launch: kernels/sampling.cu; the copy of
// the results to pinned memory, CudaSampler::send, is not timed) at the rollout engine's
// decode shape: B = 256 rows of V = 151936 BF16 logits (Qwen3's vocabulary), drawn N(0, 3).
//
//   ./build/bench_sampling [--rows B] [--repeat R]
//
// Cases: the full-vocabulary draw (temperature 1), top-p 0.9, top-k 50 and greedy. Each
// runs 3 times to warm up, then R times (default 50) back to back between two CUDA
// events; the mean is reported in microseconds per call.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include <random>

#include "rollout/cuda_sampler.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#endif

namespace {

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "bench_sampling: %s\nusage: bench_sampling [--rows B] [--repeat R]\n", problem.c_str());
  std::exit(2);
}

}  // namespace

#ifndef TANDEM_HAVE_CUDA
int main() { usage("this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)"); }
#else

using namespace tandem;

namespace {

constexpr int64_t kVocab = 151936;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 256;
  int repeat = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    if (flag == "--rows")
      rows = std::stoll(argv[++i]);
    else if (flag == "--repeat")
      repeat = std::stoi(argv[++i]);
    else
      usage("unknown flag " + flag);
  }
  if (rows < 1 || repeat < 1) usage("--rows and --repeat must be >= 1");

  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<uint16_t> bits(rows * kVocab);
  for (auto& b : bits) b = float_to_bf16(normal(rng));
  void* data = nullptr;
  check(cudaMalloc(&data, bits.size() * 2), "cudaMalloc of the logits");
  const Tensor logits = Tensor::view(data, DType::BF16, Device::CUDA, {rows, kVocab});
  copy_host_to_tensor(logits, bits.data());

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  CudaSampler sampler(rows, kVocab);
  std::vector<double> u(rows);
  for (auto& x : u) x = static_cast<double>(rng() >> 11) * 0x1.0p-53;

  struct Case {
    const char* name;
    float temperature;
    int top_k;
    float top_p;
  };
  std::printf("B = %lld, V = %lld, BF16 logits, %d calls per case\n", static_cast<long long>(rows),
              static_cast<long long>(kVocab), repeat);
  for (const Case c : {Case{"full vocabulary", 1.f, 0, 1.f}, Case{"top-p 0.9", 1.f, 0, 0.9f},
                       Case{"top-k 50", 1.f, 50, 1.f}, Case{"greedy", 0.f, 0, 1.f}}) {
    SamplingParams params;
    params.temperature = c.temperature, params.top_k = c.top_k, params.top_p = c.top_p;
    sampler.stage(std::vector<SamplingParams>(rows, params), u, stream);
    for (int i = 0; i < 3; ++i) sampler.launch(logits, stream);
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < repeat; ++i) sampler.launch(logits, stream);
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    sampler.send(stream);
    for (const SampledToken& token : sampler.results(rows))
      if (token.id < 0) throw std::runtime_error("a row's logits held a NaN or +inf");
    std::printf("  %-16s %9.1f us per call\n", c.name, 1000.0 * ms / repeat);
  }
  cudaFree(data);
  return 0;
}
#endif
