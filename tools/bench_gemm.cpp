// BF16 GEMM throughput through the CUDA matmul family (kernels/matmul.cu, cuBLASLt).
//
//   bench_gemm [--tokens N] [--repeat R]
//
// First the square forward GEMMs PyTorch's ceiling was measured on (H200, torch.matmul
// bf16: ~865 TFLOP/s at 4096³, ~790 at 8192³), then the Qwen3-0.6B linear layers at
// N tokens (default 8192): forward (out = x·Wᵀ), dx (dx += dout·W, BF16) and dweight
// (dW += doutᵀ·x, FP32), each timed alone; last the projections that read one input (q, k
// and v; gate and up) as one GEMM each over their stacked weights. Each figure: median of R (default 20) calls
// after 3 warm-up calls, a CUDA event pair around each call; FLOPs = 2·N·I·O per product.
// Inputs are random normals: all-zero data would run cooler and flatter the figures.
#include <cstdio>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "matmul.cuh"
#include "tensor/bf16.h"

using namespace tandem;

namespace {

constexpr int kWarmup = 3;

struct Options {
  int64_t tokens = 8192;
  int repeat = 20;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "bench_gemm: %s\nusage: bench_gemm [--tokens N] [--repeat R]\n", problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const long value = std::atol(argv[++i]);
    if (value < 1) usage(flag + " must be a positive integer");
    if (flag == "--tokens")
      options.tokens = value;
    else if (flag == "--repeat")
      options.repeat = static_cast<int>(value);
    else
      usage("unknown option '" + flag + "'");
  }
  return options;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("bench_gemm: ") + what + ": " + cudaGetErrorString(status));
}

// A cudaMalloc'd buffer filled with random normals (BF16) or zeros (the F32 gradient).
struct DeviceBuffer {
  void* data = nullptr;
  DeviceBuffer(size_t bytes, const std::vector<uint16_t>* pattern) {
    check_cuda(cudaMalloc(&data, bytes), "cudaMalloc");
    if (!pattern) {
      check_cuda(cudaMemset(data, 0, bytes), "cudaMemset");
      return;
    }
    // One host copy of the pattern, then device-to-device copies of it across the buffer.
    const size_t chunk = std::min(bytes, pattern->size() * sizeof(uint16_t));
    check_cuda(cudaMemcpy(data, pattern->data(), chunk, cudaMemcpyHostToDevice), "fill");
    for (size_t offset = chunk; offset < bytes; offset += chunk)
      check_cuda(cudaMemcpy(static_cast<char*>(data) + offset, data, std::min(chunk, bytes - offset),
                            cudaMemcpyDeviceToDevice),
                 "fill");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data); }
};

double median_ms(cudaStream_t stream, int repeat, const std::function<void()>& call) {
  for (int i = 0; i < kWarmup; ++i) call();
  std::vector<cudaEvent_t> starts(repeat), stops(repeat);
  for (int i = 0; i < repeat; ++i) {
    check_cuda(cudaEventCreate(&starts[i]), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stops[i]), "cudaEventCreate");
  }
  for (int i = 0; i < repeat; ++i) {
    check_cuda(cudaEventRecord(starts[i], stream), "cudaEventRecord");
    call();
    check_cuda(cudaEventRecord(stops[i], stream), "cudaEventRecord");
  }
  check_cuda(cudaStreamSynchronize(stream), "GEMMs");
  std::vector<float> ms(repeat);
  for (int i = 0; i < repeat; ++i) {
    check_cuda(cudaEventElapsedTime(&ms[i], starts[i], stops[i]), "cudaEventElapsedTime");
    cudaEventDestroy(starts[i]);
    cudaEventDestroy(stops[i]);
  }
  std::nth_element(ms.begin(), ms.begin() + repeat / 2, ms.end());
  return ms[repeat / 2];
}

struct Linear {
  const char* name;
  int64_t N, I, O;
  bool backward;  // the square GEMMs are forward-only: that is what the ceiling was measured on
};

int run(const Options& options) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  const int64_t N = options.tokens;
  // Qwen3-0.6B: hidden 1024, 16 query heads and 8 key/value heads of 128, MLP 3072, vocab 151936.
  const std::vector<Linear> layers = {
      {"square 4096^3", 4096, 4096, 4096, false}, {"square 8192^3", 8192, 8192, 8192, false},
      {"q_proj", N, 1024, 2048, true},            {"k_proj", N, 1024, 1024, true},
      {"v_proj", N, 1024, 1024, true},            {"o_proj", N, 2048, 1024, true},
      {"gate_proj", N, 1024, 3072, true},         {"up_proj", N, 1024, 3072, true},
      {"down_proj", N, 3072, 1024, true},         {"lm_head", N, 1024, 151936, true},
      // The projections that share an input, as one GEMM over their weights stacked.
      {"q|k|v", N, 1024, 4096, true},             {"gate|up", N, 1024, 6144, true},
  };
  int64_t max_x = 0, max_out = 0, max_weight = 0;
  for (const Linear& l : layers) {
    max_x = std::max(max_x, l.N * l.I);
    max_out = std::max(max_out, l.N * l.O);
    max_weight = std::max(max_weight, l.O * l.I);
  }
  std::vector<uint16_t> pattern(size_t{1} << 24);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& value : pattern) value = float_to_bf16(normal(rng));
  const DeviceBuffer x(max_x * 2, &pattern), dx(max_x * 2, &pattern), weight(max_weight * 2, &pattern),
      dweight(max_weight * 4, nullptr), out(max_out * 2, &pattern), dout(max_out * 2, &pattern);

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::MatmulContext context = cuda::make_matmul_context(stream);
  std::printf("bench_gemm on %s: BF16 data, FP32 accumulation, FP32 dweight; median of %d calls\n", properties.name,
              options.repeat);
  std::printf("%-14s %6s %6s %7s  %-8s %9s %9s\n", "layer", "N", "I", "O", "product", "ms", "TFLOP/s");
  for (const Linear& l : layers) {
    const auto view = [](const DeviceBuffer& buffer, DType dtype, std::vector<int64_t> shape) {
      return Tensor::view(buffer.data, dtype, Device::CUDA, std::move(shape));
    };
    const Tensor x_t = view(x, DType::BF16, {l.N, l.I}), w_t = view(weight, DType::BF16, {l.O, l.I}),
                 out_t = view(out, DType::BF16, {l.N, l.O}), dout_t = view(dout, DType::BF16, {l.N, l.O}),
                 dx_t = view(dx, DType::BF16, {l.N, l.I}), dw_t = view(dweight, DType::F32, {l.O, l.I}), none;
    const double flops = 2.0 * static_cast<double>(l.N) * static_cast<double>(l.I) * static_cast<double>(l.O);
    const auto report = [&](const char* product, double ms) {
      std::printf("%-14s %6lld %6lld %7lld  %-8s %9.3f %9.1f\n", l.name, static_cast<long long>(l.N),
                  static_cast<long long>(l.I), static_cast<long long>(l.O), product, ms, flops / (ms * 1e-3) / 1e12);
    };
    report("forward", median_ms(stream, options.repeat, [&] { cuda::matmul_forward(context, out_t, x_t, w_t, none); }));
    if (!l.backward) continue;
    // dx as its first writer (beta 0) and as a further branch's share (beta 1, dx read too).
    report("dx", median_ms(stream, options.repeat, [&] {
             cuda::matmul_backward(context, dx_t, none, none, dout_t, x_t, w_t, GradWrite::overwrite);
           }));
    report("dx +=", median_ms(stream, options.repeat, [&] {
             cuda::matmul_backward(context, dx_t, none, none, dout_t, x_t, w_t, GradWrite::accumulate);
           }));
    report("dweight", median_ms(stream, options.repeat, [&] {
             cuda::matmul_backward(context, none, dw_t, none, dout_t, x_t, w_t, GradWrite::accumulate);
           }));
  }
  cuda::destroy_matmul_context(context);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

#else

int main() {
  std::fprintf(stderr, "bench_gemm: this build has no CUDA backend\n");
  return 2;
}

#endif  // TANDEM_HAVE_CUDA
