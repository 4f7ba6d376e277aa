#include "embedding.cuh"

#include <algorithm>
#include <bit>
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

// One thread per pack of N columns of one token's row.
template <class T, int N>
__global__ void embedding_forward_kernel(T* out, const T* table, const int32_t* ids, int64_t tokens, int64_t columns,
                                         int64_t vocab) {
  const int64_t packs_per_row = columns / N;
  const int64_t pack = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pack >= tokens * packs_per_row) return;
  const int64_t t = pack / packs_per_row, c = pack % packs_per_row * N;
  const int32_t id = ids[t];
  Pack<T, N>* dst = reinterpret_cast<Pack<T, N>*>(out + t * columns + c);
  if (id < 0 || id >= vocab) {
    Pack<T, N> nan;
#pragma unroll
    for (int k = 0; k < N; ++k) nan.v[k] = from_float<T>(__int_as_float(0x7fc00000));
    *dst = nan;
    return;
  }
  *dst = *reinterpret_cast<const Pack<T, N>*>(table + id * columns + c);
}

// Sort keys: the id, or `vocab` for an id outside the vocabulary (sorted last, skipped).
__global__ void embedding_sort_inputs_kernel(uint32_t* keys, int32_t* tokens, const int32_t* ids, int64_t count,
                                             int64_t vocab) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const int32_t id = ids[t];
  keys[t] = id >= 0 && id < vocab ? static_cast<uint32_t>(id) : static_cast<uint32_t>(vocab);
  tokens[t] = static_cast<int32_t>(t);
}

// Where the run of `key` that starts at sorted position `first` ends; called by the whole
// block. Most runs are short, so the block looks at the next blockDim keys at once (those
// equal to `key` come first, as keys are sorted); a longer run, a frequent token, is
// finished by a binary search.
__device__ int64_t run_end(const uint32_t* keys, int64_t first, int64_t count, uint32_t key) {
  const int64_t next = first + 1 + threadIdx.x;
  const int64_t equal = __syncthreads_count(next < count && keys[next] == key);
  int64_t lo = first + 1 + equal, hi = count;
  if (equal < static_cast<int64_t>(blockDim.x)) return lo;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] == key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Block i owns the run of equal sorted ids that starts at i (other blocks exit at once):
// it adds the run's gradient rows into the vocabulary row in token order, holding the
// running sum in registers, so each vocabulary row is read and written once. The run's
// length is known before the loop, so the unrolled loop has several rows in flight: a
// frequent token's long run costs a fraction of one memory latency per row.
template <class T, int N>
__global__ void embedding_backward_kernel(float* dtable, const T* dout, const uint32_t* keys, const int32_t* tokens,
                                          int64_t count, int64_t columns, int64_t vocab) {
  const int64_t first = blockIdx.x;
  const uint32_t key = keys[first];
  if (key == vocab || (first > 0 && keys[first - 1] == key)) return;
  const int64_t end = run_end(keys, first, count, key);
  float* row = dtable + key * columns;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * N; c < columns; c += static_cast<int64_t>(blockDim.x) * N) {
    float sum[N];
    load<N>(row + c, sum);
#pragma unroll 8
    for (int64_t j = first; j < end; ++j) {
      float g[N];
      load<N>(dout + tokens[j] * columns + c, g);
#pragma unroll
      for (int k = 0; k < N; ++k) sum[k] += g[k];
    }
    store<N>(row + c, sum);
  }
}

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids, cudaStream_t stream) {
  constexpr const char* op = "cuda::embedding_forward";
  check_op_arg(table, op, "table", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  check_op_arg(ids, op, "ids", Device::CUDA, {DType::I32}, {kAnyExtent});
  const int64_t V = table.shape[0], C = table.shape[1], T = ids.shape[0];
  check_op_arg(out, op, "out", Device::CUDA, {table.dtype}, {T, C});
  if (T == 0 || C == 0) return;
  dispatch_data(table.dtype, [&](auto tag) {
    using E = decltype(tag);
    constexpr int kThreads = 256;
    auto launch = [&](auto kernel, int per_thread) {
      const int64_t packs = T * (C / per_thread);
      kernel<<<static_cast<unsigned>((packs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          out.ptr<E>(), table.ptr<E>(), ids.ptr<int32_t>(), T, C, V);
    };
    if (C % kPack<E> == 0 && aligned16(out.data, table.data))
      launch(embedding_forward_kernel<E, kPack<E>>, kPack<E>);
    else
      launch(embedding_forward_kernel<E, 1>, 1);
    check_launch(op);
  });
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, cudaStream_t stream) {
  constexpr const char* op = "cuda::embedding_backward";
  check_op_arg(dtable, op, "dtable", Device::CUDA, {DType::F32}, {kAnyExtent, kAnyExtent});
  check_op_arg(ids, op, "ids", Device::CUDA, {DType::I32}, {kAnyExtent});
  const int64_t V = dtable.shape[0], C = dtable.shape[1], T = ids.shape[0];
  check_op_arg(dout, op, "dout", Device::CUDA, {DType::F32, DType::BF16}, {T, C});
  if (V >= INT32_MAX || T >= INT32_MAX)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(V) + " vocabulary rows and " +
                                std::to_string(T) + " tokens must both stay below 2^31");
  if (T == 0 || C == 0) return;

  // Only the bits a valid id (or the sentinel V) can have take part in the sort.
  const int key_bits = std::bit_width(static_cast<uint32_t>(V));
  size_t sort_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<int>(T), 0, key_bits, stream),
             op, "sizing the radix sort");
  const size_t array_bytes = round_up_256(static_cast<size_t>(T) * 4);
  const StreamScratch scratch(4 * array_bytes + sort_bytes, stream, op);
  uint32_t* keys = scratch.at<uint32_t>(0);
  int32_t* tokens = scratch.at<int32_t>(array_bytes);
  uint32_t* sorted_keys = scratch.at<uint32_t>(2 * array_bytes);
  int32_t* sorted_tokens = scratch.at<int32_t>(3 * array_bytes);

  constexpr int kThreads = 256;
  embedding_sort_inputs_kernel<<<static_cast<unsigned>((T + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      keys, tokens, ids.ptr<int32_t>(), T, V);
  check_launch(op);
  check_cuda(cub::DeviceRadixSort::SortPairs(scratch.at<void>(4 * array_bytes), sort_bytes, keys, sorted_keys, tokens,
                                             sorted_tokens, static_cast<int>(T), 0, key_bits, stream),
             op, "radix sort of token ids");

  dispatch_data(dout.dtype, [&](auto tag) {
    using E = decltype(tag);
    auto launch = [&](auto kernel, int per_thread) {
      const int64_t packs = (C + per_thread - 1) / per_thread;
      const int threads = static_cast<int>(std::min<int64_t>(kThreads, (packs + 31) / 32 * 32));
      kernel<<<static_cast<unsigned>(T), threads, 0, stream>>>(dtable.ptr<float>(), dout.ptr<E>(), sorted_keys,
                                                              sorted_tokens, T, C, V);
    };
    if (C % kPack<E> == 0 && aligned16(dtable.data, dout.data))
      launch(embedding_backward_kernel<E, kPack<E>>, kPack<E>);
    else
      launch(embedding_backward_kernel<E, 1>, 1);
    check_launch(op);
  });
}

}  // namespace tandem::cuda
