// Memory throughput of the pointwise CUDA kernels at Qwen3-0.6B training shapes (hidden
// 1024, 16 query and 8 key/value heads of 128, intermediate 3072, vocabulary 151936),
// against a device-to-device copy timed the same way (the H200's is about 4.3 TB/s,
// read + write).
//
//   bench_pointwise [--dtype bf16|f32] [--tokens T] [--repeat R] [--calls C]
//
// Defaults: bf16, T = 8192 tokens, R = 20, C = 1. Each kernel runs 3 times to warm up,
// then R times C calls, each group of C back to back timed with CUDA events; the median
// per call is reported. Decode shapes (a step of 256 sequences: --tokens 256) take a few
// microseconds a call, less than the launch and event overhead of a call timed alone, so
// time them back to back as a replayed graph runs them: --tokens 256 --calls 100. Bytes are the least
// traffic the op needs: each input read once, each output written once, and read too where
// the op accumulates into it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include "elementwise.cuh"
#include "embedding.cuh"
#include "qk_norm_rope.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "swiglu.cuh"
#endif

namespace {

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "bench_pointwise: %s\nusage: bench_pointwise [--dtype bf16|f32] [--tokens T] [--repeat R] [--calls C]\n",
               problem.c_str());
  std::exit(2);
}

}  // namespace

#ifndef TANDEM_HAVE_CUDA
int main() { usage("this build has no CUDA backend (configure with -DTANDEM_CUDA=ON)"); }
#else

using namespace tandem;

namespace {

constexpr double kH200CopyBytesPerSecond = 4.3e12;
constexpr int64_t kHidden = 1024, kHeads = 16, kKvHeads = 8, kHeadDim = 128, kIntermediate = 3072, kVocab = 151936;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

struct Options {
  DType dtype = DType::BF16;
  int64_t tokens = 8192;
  int repeat = 20;
  int calls = 1;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--dtype" && (value == "bf16" || value == "f32"))
      options.dtype = value == "bf16" ? DType::BF16 : DType::F32;
    else if (flag == "--tokens" && std::atoll(value.c_str()) > 0)
      options.tokens = std::atoll(value.c_str());
    else if (flag == "--repeat" && std::atoi(value.c_str()) > 0)
      options.repeat = std::atoi(value.c_str());
    else if (flag == "--calls" && std::atoi(value.c_str()) > 0)
      options.calls = std::atoi(value.c_str());
    else
      usage("bad option " + flag + " " + value);
  }
  return options;
}

// Device tensors that live as long as the benchmark; contents start as a small constant
// (every byte 0x3c: about 0.0115 in both BF16 and F32), a valid value for every op.
class DeviceTensors {
 public:
  ~DeviceTensors() {
    for (void* p : buffers_) cudaFree(p);
  }
  Tensor make(DType dtype, std::vector<int64_t> shape) {
    Tensor t = Tensor::view(nullptr, dtype, Device::CUDA, std::move(shape));
    check(cudaMalloc(&t.data, t.nbytes()), "cudaMalloc");
    buffers_.push_back(t.data);
    check(cudaMemset(t.data, 0x3c, t.nbytes()), "cudaMemset");
    return t;
  }
  Tensor ints(const std::vector<int32_t>& values) {
    Tensor t = make(DType::I32, {static_cast<int64_t>(values.size())});
    check(cudaMemcpy(t.data, values.data(), t.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    return t;
  }

 private:
  std::vector<void*> buffers_;
};

double median_seconds(const std::function<void()>& launch, int repeat, int calls) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<double> seconds;
  for (int i = 0; i < repeat; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    for (int c = 0; c < calls; ++c) launch();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    seconds.push_back(ms * 1e-3 / calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

class Report {
 public:
  Report(int repeat, int calls) : repeat_(repeat), calls_(calls) {
    std::printf("%-22s %-20s %10s %9s %8s %8s\n", "kernel", "shape", "median us", "GB/s", "of copy", "of 4.3TB");
  }
  void run(const std::string& name, const std::string& shape, double bytes, const std::function<void()>& launch) {
    const double seconds = median_seconds(launch, repeat_, calls_);
    check(cudaGetLastError(), name.c_str());
    const double rate = bytes / seconds;
    if (copy_rate_ == 0) copy_rate_ = rate;
    std::printf("%-22s %-20s %10.1f %9.0f %7.0f%% %7.0f%%\n", name.c_str(), shape.c_str(), seconds * 1e6, rate / 1e9,
                100 * rate / copy_rate_, 100 * rate / kH200CopyBytesPerSecond);
  }

 private:
  int repeat_, calls_;
  double copy_rate_ = 0;  // the first row, the copy
};

std::string dims(std::initializer_list<int64_t> sizes) {
  std::string text = "[";
  for (int64_t size : sizes) text += (text.size() > 1 ? "," : "") + std::to_string(size);
  return text + "]";
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  const int64_t T = options.tokens;
  const DType dtype = options.dtype;
  const double s = static_cast<double>(dtype_size(dtype));
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  std::printf("bench_pointwise: %s, %s data, %lld tokens, median of %d groups of %d calls\n", props.name,
              dtype_name(dtype), static_cast<long long>(T), options.repeat, options.calls);

  DeviceTensors gpu;
  Report report(options.repeat, options.calls);

  const int64_t copy_bytes = int64_t{1} << 28;
  const Tensor copy_src = gpu.make(DType::U8, {copy_bytes}), copy_dst = gpu.make(DType::U8, {copy_bytes});
  report.run("device copy", "256 MiB", 2.0 * copy_bytes, [&] { cuda::copy(copy_dst, copy_src, nullptr); });

  // Uniform ids over the vocabulary, and the worst case for the sorted backward pass: one
  // id everywhere, summed by a single block.
  std::mt19937 rng(1234);
  std::vector<int32_t> uniform(T);
  for (int32_t& id : uniform) id = std::uniform_int_distribution<int32_t>(0, kVocab - 1)(rng);
  const double unique_rows = static_cast<double>(std::set<int32_t>(uniform.begin(), uniform.end()).size());
  const Tensor ids = gpu.ints(uniform), same_ids = gpu.ints(std::vector<int32_t>(T, 42));
  const Tensor table = gpu.make(dtype, {kVocab, kHidden}), dtable = gpu.make(DType::F32, {kVocab, kHidden});
  const Tensor hidden = gpu.make(dtype, {T, kHidden}), hidden2 = gpu.make(dtype, {T, kHidden});
  const Tensor hidden3 = gpu.make(dtype, {T, kHidden}), hidden4 = gpu.make(dtype, {T, kHidden});
  const double row_bytes = kHidden * s;
  report.run("embedding_forward", dims({T, kHidden}), 2 * T * row_bytes + T * 4.0,
             [&] { cuda::embedding_forward(hidden, table, ids, nullptr); });
  report.run("embedding_backward", dims({T, kHidden}), T * row_bytes + unique_rows * kHidden * 8.0 + T * 4.0,
             [&] { cuda::embedding_backward(dtable, hidden, ids, nullptr); });
  report.run("  one id repeated", dims({T, kHidden}), T * row_bytes + kHidden * 8.0 + T * 4.0,
             [&] { cuda::embedding_backward(dtable, hidden, same_ids, nullptr); });

  const Tensor norm_weight = gpu.make(dtype, {kHidden}), dnorm_weight = gpu.make(DType::F32, {kHidden});
  const Tensor rstd = gpu.make(DType::F32, {T * kHeads});
  const Tensor token_rstd = Tensor::view(rstd.data, DType::F32, Device::CUDA, {T});
  report.run("rmsnorm_forward", dims({T, kHidden}), 2 * T * row_bytes + T * 4.0,
             [&] { cuda::rmsnorm_forward(hidden2, token_rstd, hidden, norm_weight, 1e-6f, nullptr); });
  // Into the residual stream's gradient (accumulated: dx is read too).
  report.run("rmsnorm_backward", dims({T, kHidden}), 4 * T * row_bytes + T * 4.0, [&] {
    cuda::rmsnorm_backward(hidden3, dnorm_weight, hidden2, hidden, norm_weight, token_rstd, GradWrite::accumulate,
                           nullptr);
  });
  // The residual add and the next norm as the trainer's forward runs them.
  report.run("add_rmsnorm_forward", dims({T, kHidden}), 4 * T * row_bytes + T * 4.0, [&] {
    cuda::add_rmsnorm_forward(hidden2, token_rstd, hidden4, hidden, norm_weight, 1e-6f, nullptr);
  });
  // The rollout's FP8 projections (a decode step: --tokens 256): down_proj's output added
  // with its token scales, the sum normed into the next projection's codes and token scales.
  const Tensor token_scales = gpu.make(DType::F32, {T}), code_scales = gpu.make(DType::F32, {T});
  const Tensor hidden_codes = gpu.make(DType::F8_E4M3, {T, kHidden});
  report.run("add_rmsnorm to codes", dims({T, kHidden}), 3 * T * row_bytes + T * kHidden + T * 12.0, [&] {
    cuda::add_rmsnorm_forward({hidden_codes, code_scales}, token_rstd, hidden4, {hidden, token_scales}, norm_weight,
                              1e-6f, nullptr);
  });

  const Tensor q = gpu.make(dtype, {T, kHeads * kHeadDim}), q2 = gpu.make(dtype, {T, kHeads * kHeadDim});
  const Tensor dq = gpu.make(dtype, {T, kHeads * kHeadDim});
  const Tensor k = gpu.make(dtype, {T, kKvHeads * kHeadDim});
  const Tensor head_weight = gpu.make(dtype, {kHeadDim}), dhead_weight = gpu.make(DType::F32, {kHeadDim});
  auto per_head = [](const Tensor& x, int64_t heads) {
    return Tensor::view(x.data, x.dtype, x.device, {x.shape[0] * heads, kHeadDim});
  };
  const double q_bytes = T * kHeads * kHeadDim * s, k_bytes = T * kKvHeads * kHeadDim * s;
  const Tensor q_rstd = rstd, k_rstd = Tensor::view(rstd.data, DType::F32, Device::CUDA, {T * kKvHeads});
  report.run("rmsnorm_forward q", dims({T * kHeads, kHeadDim}), 2 * q_bytes + T * kHeads * 4.0, [&] {
    cuda::rmsnorm_forward(per_head(q2, kHeads), q_rstd, per_head(q, kHeads), head_weight, 1e-6f, nullptr);
  });
  report.run("rmsnorm_forward k", dims({T * kKvHeads, kHeadDim}), 2 * k_bytes + T * kKvHeads * 4.0, [&] {
    cuda::rmsnorm_forward(per_head(k, kKvHeads), k_rstd, per_head(k, kKvHeads), head_weight, 1e-6f, nullptr);
  });
  // The first (only) writer of d_q: dx overwritten, not read.
  report.run("rmsnorm_backward q", dims({T * kHeads, kHeadDim}), 3 * q_bytes + T * kHeads * 4.0, [&] {
    cuda::rmsnorm_backward(per_head(dq, kHeads), dhead_weight, per_head(q2, kHeads), per_head(q, kHeads), head_weight,
                           q_rstd, GradWrite::overwrite, nullptr);
  });

  std::vector<int32_t> packed_positions(T);
  for (int64_t t = 0; t < T; ++t) packed_positions[t] = static_cast<int32_t>(t % 1024);  // sequences of 1024
  const Tensor positions = gpu.ints(packed_positions);
  const Tensor inv_freq = gpu.make(DType::F32, {kHeadDim / 2});
  report.run("rope_backward q", dims({T, kHeads * kHeadDim}), 2 * q_bytes,
             [&] { cuda::rope_backward(dq, positions, inv_freq, kHeads, nullptr); });
  // The trainer's attention inputs: q and k normed and rotated out of place, each head's rstd
  // kept (rmsnorm_forward q/k above and both rotations, in one kernel).
  const Tensor k2 = gpu.make(dtype, {T, kKvHeads * kHeadDim});
  const Tensor q_rstd_kept = gpu.make(DType::F32, {T * kHeads}), k_rstd_kept = gpu.make(DType::F32, {T * kKvHeads});
  report.run("qk_norm_rope_forward", dims({T, kHeads + kKvHeads, kHeadDim}),
             2 * (q_bytes + k_bytes) + T * (kHeads + kKvHeads) * 4.0, [&] {
               cuda::qk_norm_rope_forward(q2, k2, q, k, head_weight, head_weight, positions, inv_freq, kHeads,
                                          kKvHeads, 1e-6f, q_rstd_kept, k_rstd_kept, nullptr);
             });

  const Tensor gate = gpu.make(dtype, {T, kIntermediate}), up = gpu.make(dtype, {T, kIntermediate});
  const Tensor mlp = gpu.make(dtype, {T, kIntermediate}), dgate = gpu.make(dtype, {T, kIntermediate});
  const Tensor dup = gpu.make(dtype, {T, kIntermediate});
  const double mlp_bytes = T * kIntermediate * s;
  report.run("swiglu_forward", dims({T, kIntermediate}), 3 * mlp_bytes,
             [&] { cuda::swiglu_forward(mlp, gate, up, nullptr); });
  report.run("swiglu_backward", dims({T, kIntermediate}), 5 * mlp_bytes,
             [&] { cuda::swiglu_backward(dgate, dup, mlp, gate, up, nullptr); });
  // SwiGLU between the rollout's FP8 gate|up and down projections: gate|up with its token
  // scales in, down's codes and token scales out.
  const Tensor gate_up = gpu.make(dtype, {T, 2 * kIntermediate}), mlp_codes = gpu.make(DType::F8_E4M3, {T, kIntermediate});
  report.run("swiglu to codes", dims({T, kIntermediate}), 2 * mlp_bytes + T * kIntermediate + T * 8.0,
             [&] { cuda::swiglu_forward({mlp_codes, code_scales}, {gate_up, token_scales}, nullptr); });
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_pointwise: %s\n", e.what());
  return 1;
}
#endif
