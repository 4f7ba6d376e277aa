#include <cuda_runtime.h>
#include <nccl.h>

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
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    ncclUniqueId id{};
    if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
    check_nccl(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  Device device() const override { return Device::CUDA; }
  void all_reduce_sum(float* data, size_t count) override {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
  }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (NCCL stream)"); }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm) { return std::make_unique<NcclCommunicator>(comm); }

}  // namespace tandem
