// CudaPagedAttention (kernels/paged_attention.cu) against its CPU twin, CpuPagedAttention,
// on fresh random inputs: batches that mix decode steps and prefill chunks, contexts from
// 1 to 1500 tokens (so that split-K cuts them into several ranges), blocks handed out in a
// shuffled order, GQA ratios 1, 2 and 4, head_dim 16, 40, 64 and 128, BF16 and F32. Cache
// rows no sequence owns, and the new tokens' rows before store, hold NaN: a kernel that
// reads a wrong row cannot pass. Both backends see identical values (BF16 inputs are
// rounded first), so the differences are the GPU's own roundings and sum orders.
//
// Tolerances on out:
// - F32 (scalar path): |gpu - cpu| <= 1e-5 + 1e-5·|cpu|. The same FP32 products and
//   exponentials, summed online instead of in two passes: ~1e-6 expected.
// - BF16: |gpu - cpu| <= 2e-2·RMS(cpu) + 2^-8·|cpu|, as in tests/gpu_ops_attention.cpp:
//   the second term is the BF16 store, the first the probabilities rounded to BF16 before
//   P·V. A wrong row, mask or split weight gives errors of the order of the RMS itself.
// store is a copy: the caches must match bit for bit. A cache of FP8 codes: see
// GpuPagedAttentionFp8 below.
#ifdef TANDEM_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/config.h"
#include "paged_attention.cuh"
#include "rollout/cpu_paged_attention.h"
#include "rollout/cuda_paged_attention.h"
#include "gpu_support.h"
#include "tensor/bf16.h"
#include "tensor/device_copy.h"
#include "tensor/fp8.h"
#include "tensor/memory_pool.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

struct Shape {
  int heads, kv_heads, head_dim;
  DType dtype;
  int block_size = 16;
  int64_t q_width() const { return static_cast<int64_t>(heads) * head_dim; }
  int64_t kv_width() const { return static_cast<int64_t>(kv_heads) * head_dim; }
};

struct SequenceSpec {
  int context;  // cached tokens once this step's are stored
  int queries;  // new tokens: 1 for decode, more for a prefill chunk
};

// One step: inputs, and the CPU's results on exactly those values.
struct Problem {
  Shape shape;
  int64_t tokens = 0, sequences = 0, max_blocks = 0, rows = 0;
  std::vector<int32_t> slots, cu_queries, context_lens, block_tables;
  std::vector<float> q, k, v;
  std::vector<float> key_cache, value_cache;      // before the store
  std::vector<float> stored_keys, stored_values;  // CPU caches after the store
  std::vector<float> out;                         // CPU attend

  Tensor host(std::vector<float>& x, std::vector<int64_t> extent) {
    return Tensor::view(x.data(), DType::F32, Device::CPU, std::move(extent));
  }
  Tensor host(std::vector<int32_t>& x, std::vector<int64_t> extent) {
    return Tensor::view(x.data(), DType::I32, Device::CPU, std::move(extent));
  }
  PagedBatch host_batch() {
    return {host(slots, {tokens}), host(cu_queries, {sequences + 1}), host(context_lens, {sequences}),
            host(block_tables, {sequences, max_blocks}), shape.block_size};
  }
};

void round_to(std::vector<float>& values, DType dtype) {
  if (dtype == DType::BF16)
    for (float& x : values) x = bf16_to_float(float_to_bf16(x));
}

// `cache_blocks` blocks of the cache are shuffled and handed to the sequences in that
// order; block tables are `max_blocks` wide, their unused tails hold block numbers far
// outside the cache (never to be read).
Problem make_problem(const Shape& shape, const std::vector<SequenceSpec>& specs, int64_t cache_blocks,
                     int64_t max_blocks, uint32_t seed) {
  Problem p;
  p.shape = shape;
  p.sequences = static_cast<int64_t>(specs.size());
  p.max_blocks = max_blocks;
  p.rows = cache_blocks * shape.block_size;
  const int bs = shape.block_size;
  std::mt19937 rng(seed);
  std::vector<int32_t> order(cache_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  const auto normal = [&](float std) {
    std::normal_distribution<float> distribution(0.f, std);
    return distribution(rng);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.key_cache.assign(p.rows * shape.kv_width(), nan);
  p.value_cache.assign(p.rows * shape.kv_width(), nan);
  p.cu_queries.push_back(0);
  size_t next_block = 0;
  for (const SequenceSpec& spec : specs) {
    const int64_t blocks = (spec.context + bs - 1) / bs;
    if (spec.queries < 1 || spec.queries > spec.context || blocks > max_blocks ||
        next_block + blocks > order.size())
      throw std::logic_error("gpu_paged_attention: the test's sequences do not fit its cache");
    for (int64_t j = 0; j < max_blocks; ++j)
      p.block_tables.push_back(j < blocks ? order[next_block + j] : 123456789);
    next_block += blocks;
    const int32_t* table = p.block_tables.data() + (p.cu_queries.size() - 1) * max_blocks;
    for (int position = 0; position < spec.context; ++position) {
      const int64_t row = static_cast<int64_t>(table[position / bs]) * bs + position % bs;
      if (position < spec.context - spec.queries) {  // cached by earlier steps
        for (int64_t e = 0; e < shape.kv_width(); ++e) {
          p.key_cache[row * shape.kv_width() + e] = normal(1.f);
          p.value_cache[row * shape.kv_width() + e] = normal(1.f);
        }
      } else {
        p.slots.push_back(static_cast<int32_t>(row));
      }
    }
    p.cu_queries.push_back(p.cu_queries.back() + spec.queries);
    p.context_lens.push_back(spec.context);
  }
  p.tokens = p.cu_queries.back();
  // Queries twice as large as keys: scores of std ~2 give peaked softmax rows, so the
  // online rescaling and the split weights really matter.
  const auto fill = [&](std::vector<float>& x, int64_t count, float std) {
    x.resize(count);
    for (float& e : x) e = normal(std);
    round_to(x, shape.dtype);
  };
  fill(p.q, p.tokens * shape.q_width(), 2.f);
  fill(p.k, p.tokens * shape.kv_width(), 1.f);
  fill(p.v, p.tokens * shape.kv_width(), 1.f);
  round_to(p.key_cache, shape.dtype);
  round_to(p.value_cache, shape.dtype);

  CpuPagedAttention cpu;
  p.stored_keys = p.key_cache;
  p.stored_values = p.value_cache;
  const Tensor keys = p.host(p.stored_keys, {p.rows, shape.kv_width()});
  const Tensor values = p.host(p.stored_values, {p.rows, shape.kv_width()});
  cpu.store({keys, values}, p.host(p.k, {p.tokens, shape.kv_width()}), p.host(p.v, {p.tokens, shape.kv_width()}),
            p.host(p.slots, {p.tokens}));
  p.out.assign(p.tokens * shape.q_width(), 0.f);
  cpu.attend(p.host(p.out, {p.tokens, shape.q_width()}), p.host(p.q, {p.tokens, shape.q_width()}), {keys, values},
             p.host_batch(), shape.heads, shape.kv_heads);
  return p;
}

// Device tensors from one pool, released together.
class DeviceTensors {
 public:
  DeviceTensors() : pool_(MemoryPool::create(Device::CUDA, 0)) {}
  ~DeviceTensors() {
    for (Allocation* allocation : allocations_) pool_->release(allocation);
  }
  MemoryPool& pool() { return *pool_; }

  Tensor make(DType dtype, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    Allocation* allocation = pool_->allocate(tags::activations, std::max<int64_t>(count, 1) * dtype_size(dtype),
                                             "paged_attention_test." + std::to_string(allocations_.size()));
    allocations_.push_back(allocation);
    return Tensor::view(allocation->ptr, dtype, Device::CUDA, std::move(shape));
  }

 private:
  std::unique_ptr<MemoryPool> pool_;
  std::vector<Allocation*> allocations_;
};

// `values` must already be representable in the tensor's dtype.
void write(const Tensor& t, const std::vector<float>& values) {
  if (t.dtype == DType::F32) return copy_host_to_tensor(t, values.data());
  std::vector<uint16_t> bits(values.size());
  std::transform(values.begin(), values.end(), bits.begin(), float_to_bf16);
  copy_host_to_tensor(t, bits.data());
}

void write(const Tensor& t, const std::vector<int32_t>& values) { copy_host_to_tensor(t, values.data()); }

std::vector<float> read(const Tensor& t) {
  std::vector<float> values(t.numel());
  if (t.dtype == DType::F32) {
    copy_tensor_to_host(values.data(), t);
    return values;
  }
  std::vector<uint16_t> bits(values.size());
  copy_tensor_to_host(bits.data(), t);
  std::transform(bits.begin(), bits.end(), values.begin(), bf16_to_float);
  return values;
}

// A problem's tensors on the device, shaped like it; `load` writes a problem of the same
// shapes into them (the contents of a later step).
struct DeviceStep {
  DeviceTensors memory;
  Tensor q, k, v, out, key_cache, value_cache, slots, cu_queries, context_lens, block_tables;
  int block_size;

  explicit DeviceStep(const Problem& p) : block_size(p.shape.block_size) {
    const DType dtype = p.shape.dtype;
    q = memory.make(dtype, {p.tokens, p.shape.q_width()});
    k = memory.make(dtype, {p.tokens, p.shape.kv_width()});
    v = memory.make(dtype, {p.tokens, p.shape.kv_width()});
    out = memory.make(dtype, {p.tokens, p.shape.q_width()});
    key_cache = memory.make(dtype, {p.rows, p.shape.kv_width()});
    value_cache = memory.make(dtype, {p.rows, p.shape.kv_width()});
    slots = memory.make(DType::I32, {p.tokens});
    cu_queries = memory.make(DType::I32, {p.sequences + 1});
    context_lens = memory.make(DType::I32, {p.sequences});
    block_tables = memory.make(DType::I32, {p.sequences, p.max_blocks});
    load(p);
  }

  void load(const Problem& p) {
    for (const auto& [tensor, values] : {std::pair{&q, &p.q}, {&k, &p.k}, {&v, &p.v}, {&key_cache, &p.key_cache},
                                         {&value_cache, &p.value_cache}})
      write(*tensor, *values);
    write(slots, p.slots);
    write(cu_queries, p.cu_queries);
    write(context_lens, p.context_lens);
    write(block_tables, p.block_tables);
  }

  PagedBatch batch() const { return {slots, cu_queries, context_lens, block_tables, block_size}; }

  void run(PagedAttention& attention, int heads, int kv_heads) {
    attention.store({key_cache, value_cache}, k, v, slots);
    attention.attend(out, q, {key_cache, value_cache}, batch(), heads, kv_heads);
  }
};

ModelConfig attention_config(const Shape& shape) {
  ModelConfig config;
  config.heads = shape.heads;
  config.kv_heads = shape.kv_heads;
  config.head_dim = shape.head_dim;
  return config;
}

double rms(const std::vector<float>& x) {
  double sum = 0;
  for (float e : x) sum += static_cast<double>(e) * e;
  return std::sqrt(sum / std::max<size_t>(x.size(), 1));
}

// The BF16 bound's first term (see the top of this file).
constexpr double kBf16RmsShare = 2e-2;

void expect_out_close(const std::vector<float>& got, const Problem& p, const std::string& what,
                      double bf16_rms_share = kBf16RmsShare) {
  ASSERT_EQ(got.size(), p.out.size()) << what;
  const double scale = rms(p.out);
  int64_t worst = 0;
  double worst_excess = -1, share_needed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": out element " << i << " = " << got[i];
    const double error = std::abs(static_cast<double>(got[i]) - p.out[i]);
    const double store = std::ldexp(std::abs(p.out[i]), -8);
    const double allowed =
        p.shape.dtype == DType::F32 ? 1e-5 + 1e-5 * std::abs(p.out[i]) : bf16_rms_share * scale + store;
    share_needed = std::max(share_needed, (error - store) / scale);
    if (error - allowed > worst_excess) {
      worst_excess = error - allowed;
      worst = static_cast<int64_t>(i);
    }
  }
  // The margin, so that passing runs show how close a bound is.
  if (p.shape.dtype != DType::F32)
    std::printf("%s: needs %.4f of the RMS past the BF16 store (bound %.4f)\n", what.c_str(), share_needed,
                bf16_rms_share);
  const int64_t token = worst / p.shape.q_width(), head = worst % p.shape.q_width() / p.shape.head_dim;
  EXPECT_LE(worst_excess, 0) << what << ": out of token " << token << " head " << head << " is " << got[worst]
                             << ", CPU " << p.out[worst] << " (RMS " << scale << ")";
}

void expect_same_cache(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::isnan(got[i]) && std::isnan(want[i])))
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
}

void expect_matches_cpu(DeviceStep& gpu, const Problem& p, const std::string& what) {
  expect_same_cache(read(gpu.key_cache), p.stored_keys, "key_cache");
  expect_same_cache(read(gpu.value_cache), p.stored_values, "value_cache");
  expect_out_close(read(gpu.out), p, what);
}

// A new seed each run, printed; TANDEM_TEST_SEED=N replays a failing run's inputs.
uint32_t fresh_seed() {
  const char* fixed = std::getenv("TANDEM_TEST_SEED");
  const uint32_t seed = fixed ? static_cast<uint32_t>(std::stoul(fixed)) : std::random_device{}();
  std::printf("seed %u\n", seed);
  return seed;
}

struct Case {
  Shape shape;
  bool decode_only;  // T == B: the decode launch; otherwise decode and prefill mixed
};

std::string case_name(const Case& c) {
  return std::string(dtype_name(c.shape.dtype)) + "_d" + std::to_string(c.shape.head_dim) + "_h" +
         std::to_string(c.shape.heads) + "_kv" + std::to_string(c.shape.kv_heads) +
         (c.shape.block_size != 16 ? "_block" + std::to_string(c.shape.block_size) : "") +
         (c.decode_only ? "_decode" : "_mixed");
}

// Decode steps at short and long contexts (a context of 1 too), prefill chunks of fresh
// prompts and of prompts continued after a long cached prefix, and decode steps of the
// same lengths between them.
std::vector<SequenceSpec> sequences_of(bool decode_only, std::mt19937& rng) {
  std::vector<SequenceSpec> specs = {{1, 1}, {17, 1}, {64, 1}, {300, 1}, {1100, 1}, {1500, 1}};
  if (!decode_only) {
    specs.insert(specs.begin() + 1, {37, 37});
    specs.insert(specs.begin() + 4, {1200, 70});
    specs.push_back({64, 5});
    specs.push_back({129, 129});
  }
  std::shuffle(specs.begin(), specs.end(), rng);
  return specs;
}

int64_t blocks_for(const std::vector<SequenceSpec>& specs, int block_size) {
  int64_t blocks = 0;
  for (const SequenceSpec& spec : specs) blocks += (spec.context + block_size - 1) / block_size;
  return blocks;
}

class GpuPagedAttention : public ::testing::TestWithParam<Case> {};

TEST_P(GpuPagedAttention, MatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Case c = GetParam();
  std::mt19937 rng(seed);
  const std::vector<SequenceSpec> specs = sequences_of(c.decode_only, rng);
  const int64_t max_blocks = (1500 + c.shape.block_size - 1) / c.shape.block_size + 3;
  const Problem problem = make_problem(c.shape, specs, blocks_for(specs, c.shape.block_size) + 7, max_blocks, seed);

  DeviceStep gpu(problem);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  {
    CudaPagedAttention attention(stream, gpu.memory.pool(), attention_config(c.shape), problem.tokens,
                                 problem.sequences, "test.paged_attention");
    gpu.run(attention, c.shape.heads, c.shape.kv_heads);
    check(cudaStreamSynchronize(stream), "paged attention kernels");
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  expect_matches_cpu(gpu, problem, case_name(c));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuPagedAttention,
    ::testing::Values(
        // Qwen3-0.6B's heads, then the other head sizes and GQA ratios: decode steps of
        // head_dim 64 and 128 with groups 1, 2 and 4 run the decode kernel, the others and
        // every mixed step the tensor-core tiles.
        Case{{16, 8, 128, DType::BF16}, false}, Case{{16, 8, 128, DType::BF16}, true},
        Case{{8, 2, 64, DType::BF16}, false}, Case{{8, 2, 64, DType::BF16}, true},
        Case{{4, 4, 128, DType::BF16}, true}, Case{{8, 2, 128, DType::BF16}, true},
        Case{{4, 2, 64, DType::BF16}, true}, Case{{16, 8, 128, DType::BF16, 32}, true},
        Case{{4, 4, 32, DType::BF16}, false}, Case{{4, 1, 16, DType::BF16}, false},
        Case{{4, 1, 16, DType::BF16}, true},
        // A GQA group wider than a block's 16 (decode) or 64 (prefill) rows; other block
        // sizes, two of them not powers of two (a decode stage's 16 keys then span blocks).
        Case{{32, 1, 64, DType::BF16}, true}, Case{{128, 1, 16, DType::BF16}, false},
        Case{{8, 2, 64, DType::BF16, 32}, false}, Case{{16, 8, 128, DType::BF16, 12}, true},
        Case{{8, 2, 64, DType::BF16, 7}, false},
        // Scalar path: a head size the tiles do not cover, and F32.
        Case{{4, 2, 40, DType::BF16}, false}, Case{{4, 1, 16, DType::F32}, false},
        Case{{8, 2, 64, DType::F32}, true}, Case{{4, 2, 128, DType::F32}, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

// Decode steps of more sequences than the decode kernel splits (B·kv_heads blocks fill
// the device), contexts from 1 to 700 tokens in one batch, as the engine's steps have: 96
// and 300 sequences (up to 5 waves of blocks), at GQA groups of 2 and 4.
TEST(GpuPagedAttentionDecode, LargeBatchOfMixedContexts) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> context(1, 700);
  for (const Shape& shape : {Shape{16, 8, 128, DType::BF16}, Shape{32, 8, 64, DType::BF16}})
    for (const int sequences : {96, 300}) {
      const std::string what = std::to_string(sequences) + " sequences, " + case_name(Case{shape, true});
      SCOPED_TRACE(what);
      std::vector<SequenceSpec> specs(sequences);
      for (SequenceSpec& spec : specs) spec = {context(rng), 1};
      const Problem problem = make_problem(shape, specs, blocks_for(specs, 16) + 7, 700 / 16 + 2, seed);

      DeviceStep gpu(problem);
      CudaPagedAttention attention(nullptr, gpu.memory.pool(), attention_config(shape), problem.tokens,
                                   problem.sequences, "test.paged_attention");
      gpu.run(attention, shape.heads, shape.kv_heads);
      check(cudaStreamSynchronize(nullptr), "paged attention kernels");
      expect_matches_cpu(gpu, problem, what);
    }
}

// A cache of FP8 codes (rollout.kv-cache-dtype = fp8) against CpuPagedAttention on the
// same codes. The cache before the step is the problem's values coded by the CPU (its
// NaN rows become NaN codes, as poisonous as before). store must write the CPU's codes
// and scales byte for byte: the GPU rounds to E4M3 as tensor/fp8.h does. attend must give
// the CPU's rows on the decoded cache within BF16's bound above with its first term at
// 1.5e-2·RMS: both kernels multiply the codes themselves (exact in BF16 and FP16) and
// apply the scales in FP32, so what is left is the weights P' in FP16, and in the decode
// kernel the queries too (measured on an H100, 3 runs of every case: up to 0.17% of the
// RMS on the tiles, 0.36% on the decode kernel). The tiles' codes times scales rounded to
// BF16, as they were, erred by 3-3.6% on every mixed step: a head's codes share one scale,
// so their roundings add up rather than cancel (tools/PERFORMANCE.md, session 31). A
// wrong row or scale still errs by the RMS itself.
constexpr double kCodedRmsShare = 1.5e-2;

struct CodedCache {
  int64_t rows, width;
  int kv_heads;
  std::vector<uint8_t> key_codes, value_codes;
  std::vector<float> key_scales, value_scales;

  CodedCache(int64_t rows, const Shape& shape)
      : rows(rows), width(shape.kv_width()), kv_heads(shape.kv_heads), key_codes(rows * width),
        value_codes(rows * width), key_scales(rows * kv_heads), value_scales(rows * kv_heads) {}

  CacheLayer host() {
    const auto codes = [&](std::vector<uint8_t>& x) {
      return Tensor::view(x.data(), DType::F8_E4M3, Device::CPU, {rows, width});
    };
    const auto scales = [&](std::vector<float>& x) {
      return Tensor::view(x.data(), DType::F32, Device::CPU, {rows, kv_heads});
    };
    return {codes(key_codes), codes(value_codes), scales(key_scales), scales(value_scales)};
  }

  CacheLayer upload(DeviceTensors& memory) const {
    const CacheLayer layer{memory.make(DType::F8_E4M3, {rows, width}), memory.make(DType::F8_E4M3, {rows, width}),
                           memory.make(DType::F32, {rows, kv_heads}), memory.make(DType::F32, {rows, kv_heads})};
    copy_host_to_tensor(layer.keys, key_codes.data());
    copy_host_to_tensor(layer.values, value_codes.data());
    copy_host_to_tensor(layer.key_scales, key_scales.data());
    copy_host_to_tensor(layer.value_scales, value_scales.data());
    return layer;
  }

  void expect_same(const CacheLayer& gpu) const {
    CodedCache got(*this);
    copy_tensor_to_host(got.key_codes.data(), gpu.keys);
    copy_tensor_to_host(got.value_codes.data(), gpu.values);
    copy_tensor_to_host(got.key_scales.data(), gpu.key_scales);
    copy_tensor_to_host(got.value_scales.data(), gpu.value_scales);
    for (int64_t i = 0; i < rows * width; ++i) {
      ASSERT_EQ(got.key_codes[i], key_codes[i]) << "key code " << i;
      ASSERT_EQ(got.value_codes[i], value_codes[i]) << "value code " << i;
    }
    expect_same_cache(got.key_scales, key_scales, "key scales");
    expect_same_cache(got.value_scales, value_scales, "value scales");
  }
};

// The GPU gets `gpu_tables` as its block tables: the problem's own, except where a test
// gives it entries that CpuPagedAttention would refuse.
void expect_coded_matches_cpu(Problem p, const std::vector<int32_t>& gpu_tables, const std::string& what) {
  SCOPED_TRACE(what);
  const Shape shape = p.shape;
  CpuPagedAttention cpu;
  CodedCache before(p.rows, shape);
  std::vector<int32_t> every_row(p.rows);
  std::iota(every_row.begin(), every_row.end(), 0);
  cpu.store(before.host(), p.host(p.key_cache, {p.rows, shape.kv_width()}),
            p.host(p.value_cache, {p.rows, shape.kv_width()}), p.host(every_row, {p.rows}));
  CodedCache after = before;
  cpu.store(after.host(), p.host(p.k, {p.tokens, shape.kv_width()}), p.host(p.v, {p.tokens, shape.kv_width()}),
            p.host(p.slots, {p.tokens}));
  cpu.attend(p.host(p.out, {p.tokens, shape.q_width()}), p.host(p.q, {p.tokens, shape.q_width()}), after.host(),
             p.host_batch(), shape.heads, shape.kv_heads);

  DeviceStep gpu(p);
  write(gpu.block_tables, gpu_tables);
  const CacheLayer cache = before.upload(gpu.memory);
  CudaPagedAttention attention(nullptr, gpu.memory.pool(), attention_config(shape), p.tokens, p.sequences,
                               "test.paged_attention");
  attention.store(cache, gpu.k, gpu.v, gpu.slots);
  attention.attend(gpu.out, gpu.q, cache, gpu.batch(), shape.heads, shape.kv_heads);
  check(cudaStreamSynchronize(nullptr), "paged attention kernels");
  after.expect_same(cache);
  expect_out_close(read(gpu.out), p, what, kCodedRmsShare);
}

void expect_coded_matches_cpu(const Shape& shape, const std::vector<SequenceSpec>& specs, int64_t max_blocks,
                              uint32_t seed, const std::string& what) {
  const Problem p = make_problem(shape, specs, blocks_for(specs, shape.block_size) + 7, max_blocks, seed);
  expect_coded_matches_cpu(p, p.block_tables, what);
}

class GpuPagedAttentionFp8 : public ::testing::TestWithParam<Case> {};

TEST_P(GpuPagedAttentionFp8, MatchesCpuOnTheSameCodes) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Case c = GetParam();
  std::mt19937 rng(seed);
  expect_coded_matches_cpu(c.shape, sequences_of(c.decode_only, rng), (1500 + c.shape.block_size - 1) / c.shape.block_size + 3,
                           seed, case_name(c));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuPagedAttentionFp8,
    ::testing::Values(
        // The decode kernel (groups of 1, 2 and 4, head_dim 64 and 128), then the
        // tensor-core tiles (mixed steps, a decode group of 8, head_dim 16), then the
        // scalar path.
        Case{{16, 8, 128, DType::BF16}, true}, Case{{8, 8, 64, DType::BF16}, true},
        Case{{16, 8, 128, DType::BF16, 32}, true}, Case{{16, 4, 128, DType::BF16}, true},
        Case{{8, 2, 64, DType::BF16}, true}, Case{{16, 8, 128, DType::BF16}, false},
        Case{{16, 2, 64, DType::BF16}, true}, Case{{8, 2, 64, DType::BF16}, false},
        Case{{4, 1, 16, DType::BF16}, false}, Case{{4, 2, 40, DType::BF16}, false},
        Case{{8, 2, 64, DType::F32}, true}, Case{{16, 8, 128, DType::BF16, 12}, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

// The engine's decode batches on the coded decode kernel: 300 sequences, contexts 1..700,
// GQA groups of 2 and 4.
TEST(GpuPagedAttentionFp8Decode, LargeBatchOfMixedContexts) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> context(1, 700);
  std::vector<SequenceSpec> specs(300);
  for (SequenceSpec& spec : specs) spec = {context(rng), 1};
  for (const Shape& shape : {Shape{16, 8, 128, DType::BF16}, Shape{32, 8, 64, DType::BF16}})
    expect_coded_matches_cpu(shape, specs, 700 / 16 + 2, seed, "300 sequences, " + case_name(Case{shape, true}));
}

// paged_attention.cuh's rule for contents CpuPagedAttention refuses: in a decode step, a
// block-table entry outside the cache (negative, or at or past its end) reads as a block of
// zeros. The CPU's tables name the one block no sequence holds, made zeros, where the
// GPU's hold such entries: a whole block before a sequence's last (the first of a short
// one, whose keys are then almost all zeros), and two neighbours in a long context (split
// into ranges). BF16 and FP8 caches.
TEST(GpuPagedAttentionDecode, BlocksOutsideTheCacheReadAsZeros) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Shape shape{16, 8, 128, DType::BF16};
  const std::vector<SequenceSpec> specs = {{300, 1}, {1100, 1}, {64, 1}, {17, 1}};
  const int bs = shape.block_size;
  const int64_t max_blocks = 1100 / bs + 2, cache_blocks = blocks_for(specs, bs) + 1, width = shape.kv_width();
  Problem p = make_problem(shape, specs, cache_blocks, max_blocks, seed);

  std::vector<bool> held(cache_blocks, false);
  for (int64_t b = 0; b < p.sequences; ++b)
    for (int64_t j = 0; j < (p.context_lens[b] + bs - 1) / bs; ++j) held[p.block_tables[b * max_blocks + j]] = true;
  const int32_t spare = static_cast<int32_t>(std::find(held.begin(), held.end(), false) - held.begin());
  for (std::vector<float>* rows : {&p.key_cache, &p.value_cache, &p.stored_keys, &p.stored_values})
    std::fill(rows->begin() + spare * bs * width, rows->begin() + (spare + 1) * bs * width, 0.f);
  std::vector<int32_t> gpu_tables = p.block_tables;
  const struct {
    int sequence, block;
    int32_t entry;
  } outside[] = {{0, 2, -1}, {1, 40, static_cast<int32_t>(cache_blocks)}, {1, 41, 1 << 30}, {3, 0, -7}};
  for (const auto& [b, j, entry] : outside) {
    gpu_tables[b * max_blocks + j] = entry;
    p.block_tables[b * max_blocks + j] = spare;
  }
  CpuPagedAttention().attend(p.host(p.out, {p.tokens, shape.q_width()}), p.host(p.q, {p.tokens, shape.q_width()}),
                             {p.host(p.stored_keys, {p.rows, width}), p.host(p.stored_values, {p.rows, width})},
                             p.host_batch(), shape.heads, shape.kv_heads);

  DeviceStep gpu(p);
  write(gpu.block_tables, gpu_tables);
  CudaPagedAttention attention(nullptr, gpu.memory.pool(), attention_config(shape), p.tokens, p.sequences,
                               "test.paged_attention");
  gpu.run(attention, shape.heads, shape.kv_heads);
  check(cudaStreamSynchronize(nullptr), "paged attention kernels");
  expect_matches_cpu(gpu, p, "BF16 cache");
  expect_coded_matches_cpu(p, gpu_tables, "FP8 cache");
}

// A CUDA graph of store + attend, captured once, replayed after new contents are written
// into the same device tensors: other contexts (short ones, then long ones that split
// into more ranges), other block tables and slots, and for a mixed step other prompt
// chunk lengths under the same total.
class GpuPagedAttentionGraph : public ::testing::TestWithParam<bool> {};

TEST_P(GpuPagedAttentionGraph, ReplaysWithNewBatchContents) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const bool decode_only = GetParam();
  const Shape shape{16, 8, 128, DType::BF16};
  std::vector<std::vector<SequenceSpec>> steps;
  if (decode_only) {
    steps = {{{5, 1}, {40, 1}, {1, 1}, {100, 1}}, {{1300, 1}, {700, 1}, {1024, 1}, {65, 1}}};
  } else {
    steps = {{{30, 30}, {9, 1}, {2, 2}, {100, 1}}, {{1, 1}, {1200, 1}, {40, 20}, {1400, 12}}};
  }
  const int64_t max_blocks = 1400 / shape.block_size + 2, cache_blocks = 4 * max_blocks;
  std::vector<Problem> problems;
  for (size_t i = 0; i < steps.size(); ++i)
    problems.push_back(make_problem(shape, steps[i], cache_blocks, max_blocks, seed + static_cast<uint32_t>(i)));
  ASSERT_EQ(problems[0].tokens, problems[1].tokens);

  DeviceStep gpu(problems[0]);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  {  // the attention object waits on its stream when it goes, so it must go first
    CudaPagedAttention attention(stream, gpu.memory.pool(), attention_config(shape), problems[0].tokens,
                                 problems[0].sequences, "test.paged_attention");
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    gpu.run(attention, shape.heads, shape.kv_heads);
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (size_t i = 0; i < problems.size(); ++i) {
      gpu.load(problems[i]);
      check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      check(cudaStreamSynchronize(stream), "graph replay");
      expect_matches_cpu(gpu, problems[i], "replay " + std::to_string(i));
    }
    check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
    check(cudaGraphDestroy(graph), "cudaGraphDestroy");
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

INSTANTIATE_TEST_SUITE_P(Steps, GpuPagedAttentionGraph, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Decode" : "Mixed");
                         });

// A workspace too small for any split still gives the right answer (one range per
// sequence), and one the caller owns works like the pool's.
TEST(GpuPagedAttentionWorkspace, AnySizeGivesTheSameResult) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Shape shape{16, 8, 128, DType::BF16};
  const std::vector<SequenceSpec> specs = {{1500, 1}, {700, 1}};
  const Problem problem = make_problem(shape, specs, blocks_for(specs, 16), 100, seed);
  for (int64_t floats : {int64_t{1}, int64_t{1} << 22}) {
    DeviceStep gpu(problem);
    CudaPagedAttention attention(nullptr, gpu.memory.make(DType::F32, {floats}));
    gpu.run(attention, shape.heads, shape.kv_heads);
    check(cudaStreamSynchronize(nullptr), "paged attention kernels");
    expect_matches_cpu(gpu, problem, std::to_string(floats) + " workspace floats");
  }
}

// The engine's layers from their fused q|k|v projection (attend_qkv): decode steps, which
// the decode kernel takes whole (it normalises and rotates the queries, stores the new
// keys and values, takes each new key from shared memory, and leaves q_scratch as it
// was), and mixed steps, which go through qkv_norm_rope_store and paged_attend; BF16 and
// FP8 caches, with and without the q/k norm weights and an FP8 projection's row scales;
// GQA groups 1, 2 and 4; the contexts of sequences_of (splits). Two references:
// - the stored rows against CpuPagedAttention::store_qkv, which keeps FP32 where the GPU
//   rounds to BF16 first: BF16 elements within 2^-8 (+ 1e-6 where rotations cancel),
//   codes as QkvNormRopeStoreIntoFp8CodesMatchesCpu's (a code step, or the subnormal step);
//   rows that no token writes keep their contents bit for bit;
// - out against CpuPagedAttention::attend of the CPU's queries rounded to BF16 on the
//   cache the GPU wrote, within expect_out_close's bounds (kCodedRmsShare for codes).
struct QkvCase {
  Shape shape;
  bool decode_only, coded, norm, row_scales;
};

std::string qkv_case_name(const QkvCase& c) {
  return case_name(Case{c.shape, c.decode_only}) + (c.coded ? "_fp8" : "") + (c.norm ? "_norm" : "") +
         (c.row_scales ? "_scaled" : "");
}

class GpuPagedAttentionQkv : public ::testing::TestWithParam<QkvCase> {};

TEST_P(GpuPagedAttentionQkv, MatchesCpuStoreQkvThenAttend) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const QkvCase c = GetParam();
  const Shape& shape = c.shape;
  const int H = shape.heads, KV = shape.kv_heads, D = shape.head_dim;
  std::mt19937 rng(seed);
  const std::vector<SequenceSpec> specs = sequences_of(c.decode_only, rng);
  Problem p = make_problem(shape, specs, blocks_for(specs, shape.block_size) + 7, 1500 / shape.block_size + 3, seed);
  const int64_t T = p.tokens, W = static_cast<int64_t>(H + 2 * KV) * D, KD = shape.kv_width();

  std::normal_distribution<float> normal(0.f, 1.f);
  const auto draws = [&](int64_t count, float mean, float std) {
    std::vector<float> x(count);
    for (float& e : x) e = mean + std * normal(rng);
    round_to(x, DType::BF16);
    return x;
  };
  std::vector<float> qkv = draws(T * W, 0.f, 2.f), q_norm = draws(D, 1.f, 0.2f), k_norm = draws(D, 1.f, 0.2f);
  std::vector<float> row_scales(T), inv_freq(D / 2);
  std::uniform_real_distribution<float> scale(0.25f, 2.f);
  for (float& e : row_scales) e = scale(rng);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / D);
  std::vector<int32_t> positions;  // each new token's place in its sequence
  for (const SequenceSpec& spec : specs)
    for (int i = 0; i < spec.queries; ++i) positions.push_back(spec.context - spec.queries + i);

  // The CPU's store_qkv into the problem's cache (coded by the CPU for FP8).
  CpuPagedAttention cpu;
  std::vector<float> cpu_keys = p.key_cache, cpu_values = p.value_cache, cpu_q(T * shape.q_width());
  CodedCache coded_before(p.rows, shape);
  std::vector<int32_t> every_row(p.rows);
  std::iota(every_row.begin(), every_row.end(), 0);
  cpu.store(coded_before.host(), p.host(p.key_cache, {p.rows, KD}), p.host(p.value_cache, {p.rows, KD}),
            p.host(every_row, {p.rows}));
  CodedCache coded_after = coded_before;
  cpu.store_qkv(p.host(cpu_q, {T, shape.q_width()}),
                c.coded ? coded_after.host() : CacheLayer{p.host(cpu_keys, {p.rows, KD}), p.host(cpu_values, {p.rows, KD})},
                ScaledRows(p.host(qkv, {T, W}), c.row_scales ? p.host(row_scales, {T}) : Tensor{}),
                c.norm ? p.host(q_norm, {D}) : Tensor{}, c.norm ? p.host(k_norm, {D}) : Tensor{},
                p.host(positions, {T}), p.host(inv_freq, {D / 2}), p.host(p.slots, {T}), H, KV, 1e-6f);

  // The GPU, q_scratch full of NaN.
  DeviceStep gpu(p);
  write(gpu.q, std::vector<float>(T * shape.q_width(), std::numeric_limits<float>::quiet_NaN()));
  const auto device = [&](DType dtype, const auto& values, std::vector<int64_t> extent) {
    const Tensor t = gpu.memory.make(dtype, std::move(extent));
    write(t, values);
    return t;
  };
  const CacheLayer gpu_cache = c.coded ? coded_before.upload(gpu.memory) : CacheLayer{gpu.key_cache, gpu.value_cache};
  CudaPagedAttention attention(nullptr, gpu.memory.pool(), attention_config(shape), T, p.sequences,
                               "test.paged_attention");
  attention.attend_qkv(gpu.out, gpu.q, gpu_cache,
                       ScaledRows(device(DType::BF16, qkv, {T, W}), c.row_scales ? device(DType::F32, row_scales, {T}) : Tensor{}),
                       c.norm ? device(DType::BF16, q_norm, {D}) : Tensor{},
                       c.norm ? device(DType::BF16, k_norm, {D}) : Tensor{}, device(DType::I32, positions, {T}),
                       device(DType::F32, inv_freq, {D / 2}), gpu.batch(), H, KV, 1e-6f);
  check(cudaStreamSynchronize(nullptr), "paged attention kernels");

  const std::vector<float> q_scratch = read(gpu.q);
  const bool q_written = std::any_of(q_scratch.begin(), q_scratch.end(), [](float x) { return !std::isnan(x); });
  EXPECT_EQ(q_written, !c.decode_only) << "q_scratch written on the decode kernel, or left unwritten on a mixed step";

  std::vector<bool> written(p.rows, false);
  for (const int32_t slot : p.slots) written[slot] = true;
  std::vector<float> gpu_keys, gpu_values;
  CodedCache gpu_coded(coded_after);
  if (!c.coded) {
    gpu_keys = read(gpu.key_cache), gpu_values = read(gpu.value_cache);
    for (const auto& [got, want, what] : {std::tuple{&gpu_keys, &cpu_keys, "key"}, std::tuple{&gpu_values, &cpu_values, "value"}})
      for (int64_t i = 0; i < static_cast<int64_t>(got->size()); ++i) {
        const float g = (*got)[i], w = (*want)[i];
        if (written[i / KD])
          ASSERT_LE(std::abs(g - w), std::ldexp(std::abs(w), -8) + 1e-6) << what << " element " << i;
        else if (!std::isnan(w))
          ASSERT_EQ(g, w) << what << " element " << i << " of a row no token writes";
      }
  } else {
    copy_tensor_to_host(gpu_coded.key_codes.data(), gpu_cache.keys);
    copy_tensor_to_host(gpu_coded.value_codes.data(), gpu_cache.values);
    copy_tensor_to_host(gpu_coded.key_scales.data(), gpu_cache.key_scales);
    copy_tensor_to_host(gpu_coded.value_scales.data(), gpu_cache.value_scales);
    for (const bool keys : {true, false}) {
      const std::vector<uint8_t>& got_codes = keys ? gpu_coded.key_codes : gpu_coded.value_codes;
      const std::vector<uint8_t>& want_codes = keys ? coded_after.key_codes : coded_after.value_codes;
      const std::vector<float>& got_scales = keys ? gpu_coded.key_scales : gpu_coded.value_scales;
      const std::vector<float>& want_scales = keys ? coded_after.key_scales : coded_after.value_scales;
      for (int64_t head = 0; head < p.rows * KV; ++head) {
        const float want_scale = want_scales[head], got_scale = got_scales[head];
        for (int64_t i = head * D; i < (head + 1) * D; ++i) {
          if (!written[head / KV]) {
            ASSERT_EQ(got_codes[i], want_codes[i]) << (keys ? "key" : "value") << " code " << i << " of a row no token writes";
            continue;
          }
          const float want = e4m3_to_float(want_codes[i]) * want_scale, got = e4m3_to_float(got_codes[i]) * got_scale;
          ASSERT_LE(std::abs(got - want), 0.125f * std::abs(want) + 0x1p-9f * want_scale + 0x1p-8f * 448 * want_scale)
              << (keys ? "key" : "value") << " code " << i << " (row " << head / KV << ")";
        }
      }
    }
  }

  // out: the CPU's attend of its queries, rounded as the GPU rounds them, on the GPU's cache.
  round_to(cpu_q, DType::BF16);
  cpu.attend(p.host(p.out, {T, shape.q_width()}), p.host(cpu_q, {T, shape.q_width()}),
             c.coded ? gpu_coded.host() : CacheLayer{p.host(gpu_keys, {p.rows, KD}), p.host(gpu_values, {p.rows, KD})},
             p.host_batch(), H, KV);
  expect_out_close(read(gpu.out), p, qkv_case_name(c), c.coded ? kCodedRmsShare : kBf16RmsShare);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuPagedAttentionQkv,
    ::testing::Values(QkvCase{{16, 8, 128, DType::BF16}, true, false, true, false},
                      QkvCase{{16, 8, 128, DType::BF16}, true, true, true, true},
                      QkvCase{{16, 8, 128, DType::BF16}, true, true, false, false},
                      QkvCase{{16, 4, 128, DType::BF16}, true, false, false, true},
                      QkvCase{{8, 8, 64, DType::BF16}, true, true, true, false},
                      QkvCase{{16, 4, 64, DType::BF16}, true, true, true, true},
                      QkvCase{{8, 8, 64, DType::BF16}, true, false, true, true},
                      QkvCase{{16, 8, 128, DType::BF16}, false, true, true, true},
                      QkvCase{{16, 8, 128, DType::BF16}, false, false, true, false}),
    [](const ::testing::TestParamInfo<QkvCase>& info) { return qkv_case_name(info.param); });

TEST(GpuPagedAttentionArgs, WrongShapesAndDtypesAreRefused) {
  REQUIRE_GPU();
  const Shape shape{4, 2, 16, DType::BF16};
  const std::vector<SequenceSpec> specs = {{20, 3}, {5, 1}};
  Problem problem = make_problem(shape, specs, 4, 2, 1);
  DeviceStep gpu(problem);
  CudaPagedAttention attention(nullptr, gpu.memory.pool(), attention_config(shape), 4, 2, "test.paged_attention");
  const Tensor f32_k = gpu.memory.make(DType::F32, {problem.tokens, shape.kv_width()});
  const Tensor host_slots = Tensor::view(problem.slots.data(), DType::I32, Device::CPU, {problem.tokens});
  const auto refused = [](auto&& call, const char* argument) {
    try {
      call();
      ADD_FAILURE() << "accepted a bad '" << argument << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + argument + "'"), std::string::npos) << e.what();
    }
  };
  const CacheLayer cache{gpu.key_cache, gpu.value_cache};
  refused([&] { attention.store(cache, f32_k, gpu.v, gpu.slots); }, "k");
  refused([&] { attention.store(cache, gpu.k, gpu.v, host_slots); }, "slots");
  refused([&] { attention.attend(gpu.out, gpu.q, {gpu.key_cache, gpu.q}, gpu.batch(), 4, 2); }, "values");
  PagedBatch batch = gpu.batch();
  batch.context_lens = gpu.slots;  // [T], not [B]
  refused([&] { attention.attend(gpu.out, gpu.q, cache, batch, 4, 2); }, "context_lens");
  EXPECT_THROW(attention.attend(gpu.out, gpu.q, cache, gpu.batch(), 4, 3), std::invalid_argument);
  EXPECT_THROW(attention.attend(gpu.out, gpu.q, cache, gpu.batch(), 3, 1), std::invalid_argument);
  batch = gpu.batch();
  batch.block_size = 0;
  EXPECT_THROW(attention.attend(gpu.out, gpu.q, cache, batch, 4, 2), std::invalid_argument);
  // A coded cache without its scales.
  const Tensor codes = gpu.memory.make(DType::F8_E4M3, {problem.rows, shape.kv_width()});
  refused([&] { attention.attend(gpu.out, gpu.q, {codes, codes}, gpu.batch(), 4, 2); }, "key_scales");
}

}  // namespace
#endif  // TANDEM_HAVE_CUDA
