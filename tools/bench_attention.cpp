// Speed of the CUDA attention kernels (kernels/attention.cu) at a packed training shape;
// by default Qwen3-0.6B's: 8 sequences × 1024 tokens, 16 query heads, 8 kv heads, head_dim
// 128, BF16.
//
//   bench_attention [--sequences S] [--length L] [--heads H] [--kv-heads K] [--head-dim D]
//                   [--dtype bf16|f32] [--repeat R]
//
// TFLOP/s count the causal work the usual way (as FlashAttention reports it): forward
// 2 products × 2 FLOP × L²/2 × D per head and sequence, backward 2.5× that. This backward
// executes 3.5× (its dq pass recomputes Q·Kᵀ and dO·Vᵀ instead of using atomics), so its
// tensor cores run 1.4× faster than the printed rate.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "attention.cuh"
#include "tensor/bf16.h"
#endif

namespace {

struct Options {
  int sequences = 8, length = 1024, heads = 16, kv_heads = 8, head_dim = 128, repeat = 20;
  bool bf16 = true;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "bench_attention: %s\nusage: bench_attention [--sequences S] [--length L] [--heads H] "
               "[--kv-heads K] [--head-dim D] [--dtype bf16|f32] [--repeat R]\n",
               problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    const auto positive = [&]() {
      const int n = std::atoi(value.c_str());
      if (n < 1) usage(flag + " must be a positive integer, got '" + value + "'");
      return n;
    };
    if (flag == "--sequences") options.sequences = positive();
    else if (flag == "--length") options.length = positive();
    else if (flag == "--heads") options.heads = positive();
    else if (flag == "--kv-heads") options.kv_heads = positive();
    else if (flag == "--head-dim") options.head_dim = positive();
    else if (flag == "--repeat") options.repeat = positive();
    else if (flag == "--dtype") {
      if (value != "bf16" && value != "f32") usage("--dtype must be bf16 or f32");
      options.bf16 = value == "bf16";
    } else {
      usage("unknown option '" + flag + "'");
    }
  }
  return options;
}

}  // namespace

#ifdef TANDEM_HAVE_CUDA
namespace {

using namespace tandem;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("bench_attention: ") + what + ": " +
                                                      cudaGetErrorString(status));
}

// A zeroed device tensor, freed by the caller.
Tensor device_tensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t = Tensor::view(nullptr, dtype, Device::CUDA, std::move(shape));
  check(cudaMalloc(&t.data, t.nbytes()), "cudaMalloc");
  check(cudaMemset(t.data, 0, t.nbytes()), "cudaMemset");
  return t;
}

// A device tensor of normal(0, 1) values in `dtype` (BF16 or F32).
Tensor random_tensor(DType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  const Tensor t = device_tensor(dtype, std::move(shape));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> values(t.numel());
  for (float& x : values) x = normal(rng);
  std::vector<uint16_t> bits;
  const void* host = values.data();
  if (dtype == DType::BF16) {
    bits.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
    host = bits.data();
  }
  check(cudaMemcpy(t.data, host, t.nbytes(), cudaMemcpyHostToDevice), "upload");
  return t;
}

template <class Step>
double milliseconds_per_call(int repeat, Step&& step) {
  for (int i = 0; i < 3; ++i) step();  // warm up: clocks, caches, shared-memory carve-out
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  check(cudaEventRecord(begin), "cudaEventRecord");
  for (int i = 0; i < repeat; ++i) step();
  check(cudaEventRecord(end), "cudaEventRecord");
  check(cudaEventSynchronize(end), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return ms / repeat;
}

int run(const Options& o) {
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  const DType dtype = o.bf16 ? DType::BF16 : DType::F32;
  const int64_t T = static_cast<int64_t>(o.sequences) * o.length;
  const int64_t q_width = static_cast<int64_t>(o.heads) * o.head_dim, kv_width = static_cast<int64_t>(o.kv_heads) * o.head_dim;
  std::mt19937 rng(1234);
  const Tensor q = random_tensor(dtype, {T, q_width}, rng), k = random_tensor(dtype, {T, kv_width}, rng),
               v = random_tensor(dtype, {T, kv_width}, rng), dout = random_tensor(dtype, {T, q_width}, rng);
  const Tensor out = device_tensor(dtype, {T, q_width}), lse = device_tensor(DType::F32, {T, o.heads});
  const Tensor dq = device_tensor(dtype, {T, q_width}), dk = device_tensor(dtype, {T, kv_width}),
               dv = device_tensor(dtype, {T, kv_width});
  std::vector<int32_t> offsets(o.sequences + 1);
  for (int s = 0; s <= o.sequences; ++s) offsets[s] = s * o.length;
  const Tensor cu = device_tensor(DType::I32, {o.sequences + 1});
  check(cudaMemcpy(cu.data, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice), "upload cu_seqlens");

  const double forward_ms = milliseconds_per_call(o.repeat, [&] {
    cuda::attention_forward(out, lse, q, k, v, cu, o.heads, o.kv_heads, nullptr);
  });
  // The dS scratch at the size the kernels need for any packing of T tokens (the trainer
  // lends its logits buffer, larger still).
  const Tensor row_dots = device_tensor(DType::F32, {T, o.heads});
  const Tensor score_grads =
      device_tensor(DType::BF16, {cuda::attention_score_grad_elements(T, o.sequences, o.heads)});
  // Each call overwrites the gradients.
  const auto backward_ms = [&](const Tensor& scores) {
    return milliseconds_per_call(o.repeat, [&] {
      cuda::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu, o.heads, o.kv_heads, {row_dots, scores},
                               nullptr);
    });
  };
  const double stored_ms = backward_ms(score_grads), recomputed_ms = backward_ms(Tensor{});
  check(cudaGetLastError(), "kernels");

  const double forward_flop = 2.0 * 2.0 * o.length * (o.length / 2.0) * o.head_dim * o.heads * o.sequences;
  const double backward_flop = 2.5 * forward_flop;
  std::printf("device %s; %d sequences x %d tokens, %d heads / %d kv heads, head_dim %d, %s\n", props.name,
              o.sequences, o.length, o.heads, o.kv_heads, o.head_dim, o.bf16 ? "BF16" : "F32");
  std::printf("forward   %8.3f ms  %7.1f TFLOP/s\n", forward_ms, forward_flop / forward_ms / 1e9);
  std::printf("backward  %8.3f ms  %7.1f TFLOP/s  (model FLOPs, 2.5x forward)\n", stored_ms,
              backward_flop / stored_ms / 1e9);
  std::printf("backward without the dS scratch (dq recomputes it)  %8.3f ms  %7.1f TFLOP/s\n", recomputed_ms,
              backward_flop / recomputed_ms / 1e9);
  for (const Tensor* t : {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv, &cu, &row_dots, &score_grads}) cudaFree(t->data);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_attention: no CUDA device\n");
    return 1;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
#else
int main(int argc, char** argv) {
  parse(argc, argv);
  std::fprintf(stderr, "bench_attention: this build has no CUDA backend\n");
  return 1;
}
#endif
