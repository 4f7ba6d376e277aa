#include "rmsnorm.cuh"

#include <algorithm>
#include <type_traits>

#include "model/op_args.h"
#include "pointwise.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;
// The backward pass writes one row of weight-gradient partials per block: enough blocks
// to fill the GPU, few enough that the partials stay small next to the activations.
constexpr int64_t kMaxPartials = 512;

// Each row is handled by a group of G lanes of one warp, each lane taking packs of N
// elements G·N apart; the group leaves or stays as a whole, so its sums never wait on
// an exited lane.
template <class T, int N, int G>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* weight, int64_t rows, int columns,
                                       float eps) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  const int lane = threadIdx.x % G;
  if (row >= rows) return;
  const T* xr = x + row * columns;
  float sum = 0;
#pragma unroll 4
  for (int c = lane * N; c < columns; c += G * N) {
    float v[N];
    load<N>(xr + c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) sum += v[k] * v[k];
  }
  sum = group_sum<G>(sum, group_mask<G>());
  const float r = 1.0f / sqrtf(sum / static_cast<float>(columns) + eps);
  if (lane == 0) rstd[row] = r;
  T* yr = out + row * columns;
#pragma unroll 4
  for (int c = lane * N; c < columns; c += G * N) {
    float v[N], w[N];
    load<N>(xr + c, v);
    load<N>(weight + c, w);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = w[k] * (v[k] * r);
    store<N>(yr + c, v);
  }
}

// Block b owns rows [b·rows_per_block, (b+1)·rows_per_block); its groups take every
// groups-th row of them. Each group sums dout·x·rstd of its rows in shared memory, laid
// out pack-major (element k of pack p at k·packs + p) so a group's lanes touch
// consecutive banks; the block then writes the sum over its groups, in group order,
// as partials[b] in that same layout.
template <class T, int N, int G>
__global__ void rmsnorm_backward_kernel(T* dx, float* partials, const T* dout, const T* x, const T* weight,
                                        const float* rstd, int64_t rows, int columns, int64_t rows_per_block) {
  extern __shared__ float group_dweight[];  // [groups][columns]
  const int groups = blockDim.x / G, group = threadIdx.x / G, lane = threadIdx.x % G;
  const int packs = columns / N;
  const unsigned mask = group_mask<G>();
  float* dweight = group_dweight + group * columns;
  for (int p = lane; p < packs; p += G)
#pragma unroll
    for (int k = 0; k < N; ++k) dweight[k * packs + p] = 0;

  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t end = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row = first + group; row < end; row += groups) {
    const T* dy = dout + row * columns;
    const T* xr = x + row * columns;
    T* dxr = dx + row * columns;
    const float r = rstd[row];
    // With n = x·rstd and dn = dout·weight: dx = rstd·(dn - n·mean(dn·n)).
    float dot = 0;
#pragma unroll 4
    for (int p = lane; p < packs; p += G) {
      float g[N], v[N], w[N];
      load<N>(dy + p * N, g);
      load<N>(xr + p * N, v);
      load<N>(weight + p * N, w);
#pragma unroll
      for (int k = 0; k < N; ++k) dot += g[k] * w[k] * v[k];
    }
    const float mean = group_sum<G>(dot, mask) * r / static_cast<float>(columns);
#pragma unroll 4
    for (int p = lane; p < packs; p += G) {
      float g[N], v[N], w[N], d[N];
      load<N>(dy + p * N, g);
      load<N>(xr + p * N, v);
      load<N>(weight + p * N, w);
      load<N>(dxr + p * N, d);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        d[k] += r * (g[k] * w[k] - v[k] * r * mean);
        dweight[k * packs + p] += g[k] * v[k] * r;
      }
      store<N>(dxr + p * N, d);
    }
  }
  __syncthreads();
  float* partial = partials + blockIdx.x * static_cast<int64_t>(columns);
  for (int i = threadIdx.x; i < columns; i += blockDim.x) {
    float sum = 0;
    for (int g = 0; g < groups; ++g) sum += group_dweight[g * columns + i];
    partial[i] = sum;
  }
}

// dweight += the sum of the blocks' partials, in block order: thread (i, j) of a
// 32×32 block sums every 32nd partial of index i from j, then lane j = 0 adds the 32
// sums in order. Partials are pack-major (see above); the column is unscrambled here.
__global__ void rmsnorm_dweight_kernel(float* dweight, const float* partials, int64_t blocks, int columns, int pack) {
  __shared__ float sums[32][33];
  const int i = blockIdx.x * 32 + threadIdx.x;
  float sum = 0;
  if (i < columns)
    for (int64_t b = threadIdx.y; b < blocks; b += 32) sum += partials[b * columns + i];
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || i >= columns) return;
  float total = 0;
  for (int j = 0; j < 32; ++j) total += sums[j][threadIdx.x];
  const int packs = columns / pack;
  dweight[i % packs * pack + i / packs] += total;
}

// Calls f(integral_constant<int, G>) with the group size for rows of `packs` packs: the
// smallest power of two from 4 to 32 that covers the row in one pass where it can.
template <class F>
void with_group_size(int64_t packs, F&& f) {
  if (packs > 16)
    f(std::integral_constant<int, 32>{});
  else if (packs > 8)
    f(std::integral_constant<int, 16>{});
  else if (packs > 4)
    f(std::integral_constant<int, 8>{});
  else
    f(std::integral_constant<int, 4>{});
}

}  // namespace

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight, float eps,
                     cudaStream_t stream) {
  constexpr const char* op = "cuda::rmsnorm_forward";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t N = x.shape[0], D = x.shape[1];
  check_op_arg(out, op, "out", Device::CUDA, {x.dtype}, {N, D});
  check_op_arg(rstd, op, "rstd", Device::CUDA, {DType::F32}, {N});
  check_op_arg(weight, op, "weight", Device::CUDA, {x.dtype}, {D});
  if (N == 0 || D == 0) return;
  dispatch_data(x.dtype, [&](auto tag) {
    using E = decltype(tag);
    auto launch = [&](auto pack) {
      constexpr int P = decltype(pack)::value;
      with_group_size(D / P, [&](auto group) {
        constexpr int G = decltype(group)::value;
        const int64_t blocks = (N * G + kThreads - 1) / kThreads;
        rmsnorm_forward_kernel<E, P, G><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            out.ptr<E>(), rstd.ptr<float>(), x.ptr<E>(), weight.ptr<E>(), N, static_cast<int>(D), eps);
      });
    };
    if (D % kPack<E> == 0 && aligned16(out.data, x.data, weight.data))
      launch(std::integral_constant<int, kPack<E>>{});
    else
      launch(std::integral_constant<int, 1>{});
    check_launch(op);
  });
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd, cudaStream_t stream) {
  constexpr const char* op = "cuda::rmsnorm_backward";
  check_op_arg(x, op, "x", Device::CUDA, {DType::F32, DType::BF16}, {kAnyExtent, kAnyExtent});
  const int64_t N = x.shape[0], D = x.shape[1];
  check_op_arg(dx, op, "dx", Device::CUDA, {x.dtype}, {N, D});
  check_op_arg(dweight, op, "dweight", Device::CUDA, {DType::F32}, {D});
  check_op_arg(dout, op, "dout", Device::CUDA, {x.dtype}, {N, D});
  check_op_arg(weight, op, "weight", Device::CUDA, {x.dtype}, {D});
  check_op_arg(rstd, op, "rstd", Device::CUDA, {DType::F32}, {N});
  if (D > kRmsnormMaxColumns)
    throw std::invalid_argument(std::string(op) + ": rows of " + std::to_string(D) + " exceed the " +
                                std::to_string(kRmsnormMaxColumns) + " the backward pass supports");
  if (N == 0 || D == 0) return;
  dispatch_data(x.dtype, [&](auto tag) {
    using E = decltype(tag);
    auto launch = [&](auto pack) {
      constexpr int P = decltype(pack)::value;
      with_group_size(D / P, [&](auto group) {
        constexpr int G = decltype(group)::value;
        // The chunking depends on the shape alone, never on the device, so the order
        // of every sum is the same on every GPU and every run.
        const int64_t groups = std::min<int64_t>(kThreads / G, kRmsnormMaxColumns / D);
        const int64_t rows_per_block = groups * ((N + groups * kMaxPartials - 1) / (groups * kMaxPartials));
        const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
        const StreamScratch partials(static_cast<size_t>(blocks * D) * sizeof(float), stream, op);
        const size_t shared_bytes = static_cast<size_t>(groups * D) * sizeof(float);
        rmsnorm_backward_kernel<E, P, G><<<static_cast<unsigned>(blocks), static_cast<unsigned>(groups * G),
                                           shared_bytes, stream>>>(dx.ptr<E>(), partials.at<float>(0), dout.ptr<E>(),
                                                                   x.ptr<E>(), weight.ptr<E>(), rstd.ptr<float>(), N,
                                                                   static_cast<int>(D), rows_per_block);
        check_launch(op);
        rmsnorm_dweight_kernel<<<static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, stream>>>(
            dweight.ptr<float>(), partials.at<float>(0), blocks, static_cast<int>(D), P);
      });
    };
    if (D % kPack<E> == 0 && aligned16(dx.data, dout.data, x.data, weight.data))
      launch(std::integral_constant<int, kPack<E>>{});
    else
      launch(std::integral_constant<int, 1>{});
    check_launch(op);
  });
}

}  // namespace tandem::cuda
