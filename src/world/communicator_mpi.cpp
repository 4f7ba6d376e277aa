#include <stdexcept>
#include <string>

#include "world/communicator.h"
#include "world/stall_guard.h"

namespace tandem {

namespace {

void check_mpi(int status, const char* what) {
  if (status != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    throw std::runtime_error(std::string(what) + ": " + std::string(text, length));
  }
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {}
  Device device() const override { return Device::CPU; }
  void all_reduce_sum(float* data, size_t count) override {
    // MPI counts are int: large buffers go in slices.
    constexpr size_t kSlice = size_t{1} << 30;
    for (size_t offset = 0; offset < count; offset += kSlice) {
      const int n = static_cast<int>(std::min(kSlice, count - offset));
      MPI_Request request;
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comm_, &request), "MPI_Iallreduce");
      wait_for_ranks(request, "the gradient all-reduce", comm_);
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    // The ranks arrive through the stall guard, then the bytes move in blocking calls:
    // the guard's sleeps between tests would hold back MPI's progress through a large
    // message (every fragment waiting for the next test: 0.05 GB/s instead of GB/s).
    MPI_Request arrival;
    check_mpi(MPI_Ibarrier(comm_, &arrival), "MPI_Ibarrier");
    wait_for_ranks(arrival, "a broadcast", comm_);
    constexpr size_t kSlice = size_t{1} << 30;
    auto* base = static_cast<char*>(data);
    for (size_t offset = 0; offset < bytes; offset += kSlice) {
      const int n = static_cast<int>(std::min(kSlice, bytes - offset));
      check_mpi(MPI_Bcast(base + offset, n, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }
  void synchronize() override {}

 private:
  MPI_Comm comm_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) { return std::make_unique<MpiCommunicator>(comm); }

#ifndef TANDEM_HAVE_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm) {
  throw std::runtime_error("this tandem was built without CUDA, so without NCCL");
}
#endif

}  // namespace tandem
