// Speed of the rollout engine's paged attention (kernels/paged_attention.cu) at
// Qwen3-0.6B's shape: 16 query heads, 8 kv heads, head_dim 128, BF16, blocks of 16 tokens
// handed out in a shuffled order.
//
//   ./build/bench_paged_attention                      # the standard table below
//   ./build/bench_paged_attention --batch 64 --context 2048 [--heads 16] [--kv-heads 8]
//       [--head-dim 128] [--block-size 16] [--layers 28] [--repeat 20] [--kv bf16|fp8]
//   ./build/bench_paged_attention --batch 256 --context 64-448   # contexts drawn uniformly
//   ./build/bench_paged_attention --batch 64 --context 128 --queries 128  # a prefill step
//
// Standard table: batch 256 at contexts 128, 256 and 512 and at contexts spread over
// 64..448 (as an engine's batch is), batch 64 at 256, 512 and 2048, and batch 8 at 2048
// (few sequences: split-K), all decode steps. --queries Q makes each sequence's last Q
// tokens new (a prompt chunk, causal, as a prefill step runs them; 1 is a decode step).
// One layer-call is attend for one layer's cache (store, of the step's new K and V rows, is
// timed apart). The calls cycle through `layers` caches, as a model's layers do, so that
// the KV read comes from HBM and not from the 50 MB L2; a CUDA graph of one pass over the layers is replayed `repeat`
// times. Bandwidth counts the K and V rows read once (the contexts' sum × 2 × kv_width ×
// 2 bytes; with --kv fp8, a cache of E4M3 codes, kv_width + 4·kv_heads bytes of codes and
// scales); the H200's HBM3e peaks at about 4.8 TB/s.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>

#include "model/config.h"
#include "rollout/cuda_paged_attention.h"
#include "tensor/bf16.h"
#include "tensor/fp8.h"
#include "tensor/memory_pool.h"
#endif

namespace {

struct Run {
  int batch, min_context, max_context;  // contexts drawn uniformly from [min, max]
  int queries;                          // new tokens a sequence, the last of its context
};

struct Options {
  std::vector<Run> runs;
  int heads = 16, kv_heads = 8, head_dim = 128, block_size = 16, layers = 28, repeat = 20;
  bool fp8 = false;  // --kv fp8
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "bench_paged_attention: %s\nusage: bench_paged_attention [--batch B --context C|LO-HI] [--heads H] "
               "[--kv-heads K] [--head-dim D] [--block-size S] [--layers L] [--repeat R] [--kv bf16|fp8] [--queries Q]\n",
               problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  int batch = 0, min_context = 0, max_context = 0, queries = 1;
  const auto positive = [](const std::string& flag, const std::string& value) {
    const int n = std::atoi(value.c_str());
    if (n < 1 || std::to_string(n) != value) usage(flag + " must be a positive integer, got '" + value + "'");
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--context") {
      const size_t dash = value.find('-');
      min_context = positive(flag, value.substr(0, dash));
      max_context = dash == std::string::npos ? min_context : positive(flag, value.substr(dash + 1));
      if (max_context < min_context) usage("--context LO-HI needs LO <= HI, got '" + value + "'");
      continue;
    }
    if (flag == "--kv") {
      if (value != "bf16" && value != "fp8") usage("--kv takes bf16 or fp8, got '" + value + "'");
      options.fp8 = value == "fp8";
      continue;
    }
    const int n = positive(flag, value);
    if (flag == "--batch") batch = n;
    else if (flag == "--heads") options.heads = n;
    else if (flag == "--kv-heads") options.kv_heads = n;
    else if (flag == "--head-dim") options.head_dim = n;
    else if (flag == "--block-size") options.block_size = n;
    else if (flag == "--layers") options.layers = n;
    else if (flag == "--repeat") options.repeat = n;
    else if (flag == "--queries") queries = n;
    else usage("unknown option '" + flag + "'");
  }
  if ((batch == 0) != (min_context == 0)) usage("--batch and --context go together");
  if (queries > 1 && !batch) usage("--queries goes with --batch and --context");
  if (queries > min_context && batch) usage("--queries must not exceed the shortest context");
  if (batch) options.runs = {{batch, min_context, max_context, queries}};
  else
    options.runs = {{256, 128, 128, 1}, {256, 256, 256, 1}, {256, 512, 512, 1},   {256, 64, 448, 1},
                    {64, 256, 256, 1},  {64, 512, 512, 1},  {64, 2048, 2048, 1}, {8, 2048, 2048, 1}};
  return options;
}

}  // namespace

#ifdef TANDEM_HAVE_CUDA
namespace {

using namespace tandem;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("bench_paged_attention: ") + what + ": " + cudaGetErrorString(status));
}

// Device tensors from one pool, released when it goes.
class DeviceMemory {
 public:
  DeviceMemory() : pool_(MemoryPool::create(Device::CUDA, 0)) {}
  ~DeviceMemory() {
    for (Allocation* allocation : allocations_) pool_->release(allocation);
  }
  MemoryPool& pool() { return *pool_; }

  Tensor make(DType dtype, std::vector<int64_t> shape) {
    Tensor t = Tensor::view(nullptr, dtype, Device::CUDA, std::move(shape));
    allocations_.push_back(pool_->allocate(tags::kv_cache, t.nbytes(), "bench." + std::to_string(allocations_.size())));
    t.data = allocations_.back()->ptr;
    return t;
  }

  template <class T>
  Tensor upload(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
    const Tensor t = make(dtype, std::move(shape));
    check(cudaMemcpy(t.data, values.data(), t.nbytes(), cudaMemcpyHostToDevice), "upload");
    return t;
  }

 private:
  std::unique_ptr<MemoryPool> pool_;
  std::vector<Allocation*> allocations_;
};

std::vector<uint16_t> random_bf16(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> bits(count);
  for (uint16_t& b : bits) b = float_to_bf16(normal(rng));
  return bits;
}

template <class Step>
double microseconds_per_call(cudaStream_t stream, int calls_per_step, int repeat, Step&& step) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  step();
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int i = 0; i < 3; ++i) check(cudaGraphLaunch(exec, stream), "warm-up");
  cudaEvent_t begin, end;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  check(cudaEventRecord(begin, stream), "cudaEventRecord");
  for (int i = 0; i < repeat; ++i) check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check(cudaEventRecord(end, stream), "cudaEventRecord");
  check(cudaEventSynchronize(end), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1e3 * ms / (static_cast<double>(repeat) * calls_per_step);
}

void run(const Options& o, const Run& r, cudaStream_t stream) {
  const int64_t B = r.batch, Q = r.queries, T = B * Q, kv_width = static_cast<int64_t>(o.kv_heads) * o.head_dim;
  const int64_t q_width = static_cast<int64_t>(o.heads) * o.head_dim;
  const int64_t max_blocks = (r.max_context + o.block_size - 1) / o.block_size;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> draw(r.min_context, r.max_context);
  std::vector<int32_t> lengths(B);
  int64_t blocks = 0, keys_read = 0;
  for (int32_t& length : lengths) {
    length = draw(rng);
    blocks += (length + o.block_size - 1) / o.block_size;
    keys_read += length;
  }
  const int64_t rows = blocks * o.block_size;
  DeviceMemory memory;

  // Every sequence's blocks scattered over the cache; this step's tokens are its last Q.
  std::vector<int32_t> order(blocks), tables(B * max_blocks, 0), slots(T), cu(B + 1);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t b = 0, next = 0; b < B; ++b) {
    cu[b] = static_cast<int32_t>(b * Q);
    const int32_t* own = order.data() + next;
    std::copy(own, own + (lengths[b] + o.block_size - 1) / o.block_size, tables.begin() + b * max_blocks);
    next += (lengths[b] + o.block_size - 1) / o.block_size;
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t position = lengths[b] - Q + i;
      slots[b * Q + i] = static_cast<int32_t>(own[position / o.block_size] * o.block_size + position % o.block_size);
    }
  }
  cu[B] = static_cast<int32_t>(T);
  const PagedBatch paged{memory.upload(DType::I32, {T}, slots), memory.upload(DType::I32, {B + 1}, cu),
                         memory.upload(DType::I32, {B}, lengths), memory.upload(DType::I32, {B, max_blocks}, tables),
                         o.block_size};
  const Tensor q = memory.upload(DType::BF16, {T, q_width}, random_bf16(T * q_width, rng));
  const Tensor k = memory.upload(DType::BF16, {T, kv_width}, random_bf16(T * kv_width, rng));
  const Tensor v = memory.upload(DType::BF16, {T, kv_width}, random_bf16(T * kv_width, rng));
  const Tensor out = memory.make(DType::BF16, {T, q_width});
  // Each layer's cache: BF16 rows, or codes of normal values at a scale of 1/64.
  std::vector<CacheLayer> layers;
  const std::vector<uint16_t> layer_values = random_bf16(rows * kv_width, rng);
  std::vector<uint8_t> codes(layer_values.size());
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = float_to_e4m3(64 * bf16_to_float(layer_values[i]));
  const std::vector<float> scales(rows * o.kv_heads, 1.f / 64);
  for (int l = 0; l < o.layers; ++l) {
    if (o.fp8)
      layers.push_back({memory.upload(DType::F8_E4M3, {rows, kv_width}, codes),
                        memory.upload(DType::F8_E4M3, {rows, kv_width}, codes),
                        memory.upload(DType::F32, {rows, o.kv_heads}, scales),
                        memory.upload(DType::F32, {rows, o.kv_heads}, scales)});
    else
      layers.push_back({memory.upload(DType::BF16, {rows, kv_width}, layer_values),
                        memory.upload(DType::BF16, {rows, kv_width}, layer_values)});
  }

  ModelConfig config;
  config.heads = o.heads;
  config.kv_heads = o.kv_heads;
  config.head_dim = o.head_dim;
  CudaPagedAttention attention(stream, memory.pool(), config, T, B, "bench.paged_attention");
  const double attend_us = microseconds_per_call(stream, o.layers, o.repeat, [&] {
    for (int l = 0; l < o.layers; ++l) attention.attend(out, q, layers[l], paged, o.heads, o.kv_heads);
  });
  const double store_us = microseconds_per_call(stream, o.layers, o.repeat, [&] {
    for (int l = 0; l < o.layers; ++l) attention.store(layers[l], k, v, paged.slots);
  });
  const double row_bytes = o.fp8 ? kv_width + 4.0 * o.kv_heads : 2.0 * kv_width;
  const double bytes = static_cast<double>(keys_read) * 2 * row_bytes;
  const double gb_per_s = bytes / attend_us / 1e3;
  const std::string contexts = r.min_context == r.max_context
                                   ? std::to_string(r.min_context)
                                   : std::to_string(r.min_context) + "-" + std::to_string(r.max_context);
  if (Q > 1) std::printf("queries %d  ", r.queries);
  std::printf("batch %4d  context %9s  attend %8.2f us/layer  %7.0f GB/s (%4.1f%% of 4800)  store %6.2f us/layer\n",
              r.batch, contexts.c_str(), attend_us, gb_per_s, gb_per_s / 48, store_us);
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_paged_attention: no CUDA device\n");
    return 1;
  }
  try {
    cudaDeviceProp props{};
    check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
    std::printf("device %s; %d heads / %d kv heads, head_dim %d, BF16, %sblock %d, %d layers, %s\n",
                props.name, options.heads, options.kv_heads, options.head_dim,
                options.fp8 ? "KV cache FP8 E4M3 + scales, " : "", options.block_size, options.layers,
                options.runs[0].queries == 1 ? "decode (1 query each)" : "prompt chunks (causal)");
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (const Run& r : options.runs) run(options, r, stream);
    cudaStreamDestroy(stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
#else
int main(int argc, char** argv) {
  parse(argc, argv);
  std::fprintf(stderr, "bench_paged_attention: this build has no CUDA backend\n");
  return 1;
}
#endif
