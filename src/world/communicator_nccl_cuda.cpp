#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "world/communicator.h"

namespace tandem {

namespace {

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(status));
}
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(MPI_Comm comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    ncclUniqueId id{};
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  Device device() const override { return Device::CUDA; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, size_t count) override {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
  }
  // Equal ranges: NCCL's reduce-scatter and all-gather, in place. Unequal ones (Muon's
  // shards): one reduce or broadcast per rank's range, rooted at that rank, in one group.
  void reduce_scatter_sum(float* data, std::span<const size_t> counts) override {
    if (equal(counts)) {
      check_nccl(ncclReduceScatter(data, data + rank_ * counts[0], counts[0], ncclFloat32, ncclSum, comm_, stream_),
                 "ncclReduceScatter");
      return;
    }
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    size_t offset = 0;
    for (int root = 0; root < size_; ++root) {
      check_nccl(ncclReduce(data + offset, data + offset, counts[root], ncclFloat32, ncclSum, root, comm_, stream_),
                 "ncclReduce");
      offset += counts[root];
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  void all_gather(void* data, std::span<const size_t> counts, size_t element_bytes) override {
    auto* bytes = static_cast<char*>(data);
    if (equal(counts)) {
      const size_t each = counts[0] * element_bytes;
      check_nccl(ncclAllGather(bytes + rank_ * each, bytes, each, ncclUint8, comm_, stream_), "ncclAllGather");
      return;
    }
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    size_t offset = 0;
    for (int root = 0; root < size_; ++root) {
      const size_t each = counts[root] * element_bytes;
      check_nccl(ncclBroadcast(bytes + offset, bytes + offset, each, ncclUint8, root, comm_, stream_), "ncclBroadcast");
      offset += each;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (NCCL stream)"); }

 private:
  static bool equal(std::span<const size_t> counts) {
    return std::all_of(counts.begin(), counts.end(), [&](size_t count) { return count == counts[0]; });
  }

  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm) { return std::make_unique<NcclCommunicator>(comm); }

}  // namespace tandem
