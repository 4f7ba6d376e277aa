#include <climits>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

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

// MPI's counts and displacements are int: a rank's range past INT_MAX elements is refused.
std::vector<int> int_counts(std::span<const size_t> counts, const char* what) {
  std::vector<int> result;
  for (size_t count : counts) {
    if (count > static_cast<size_t>(INT_MAX))
      throw std::runtime_error(std::string(what) + ": a rank's range of " + std::to_string(count) +
                               " elements is past MPI's int counts");
    result.push_back(static_cast<int>(count));
  }
  return result;
}

std::vector<int> displacements(const std::vector<int>& counts, const char* what) {
  std::vector<int> result;
  size_t offset = 0;
  for (int count : counts) {
    if (offset > static_cast<size_t>(INT_MAX))
      throw std::runtime_error(std::string(what) + ": a displacement of " + std::to_string(offset) +
                               " elements is past MPI's int counts");
    result.push_back(static_cast<int>(offset));
    offset += static_cast<size_t>(count);
  }
  return result;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  Device device() const override { return Device::CPU; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
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
    constexpr size_t kSlice = size_t{1} << 30;  // MPI counts are int
    auto* base = static_cast<char*>(data);
    for (size_t offset = 0; offset < bytes; offset += kSlice) {
      MPI_Request request;
      check_mpi(MPI_Ibcast(base + offset, static_cast<int>(std::min(kSlice, bytes - offset)), MPI_BYTE, root, comm_, &request),
                "MPI_Ibcast");
      wait_for_ranks(request, "a broadcast", comm_);
    }
  }
  void reduce_scatter_sum(float* data, std::span<const size_t> counts) override {
    const std::vector<int> n = int_counts(counts, "the gradient reduce-scatter");
    const size_t at = std::accumulate(counts.begin(), counts.begin() + rank_, size_t{0});
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter(MPI_IN_PLACE, data, n.data(), MPI_FLOAT, MPI_SUM, comm_, &request),
              "MPI_Ireduce_scatter");
    wait_for_ranks(request, "the gradient reduce-scatter", comm_);
    // In place, MPI leaves this rank's sum at the buffer's start.
    std::memmove(data + at, data, static_cast<size_t>(n[rank_]) * sizeof(float));
  }
  void all_gather(void* data, std::span<const size_t> counts, size_t element_bytes) override {
    const std::vector<int> n = int_counts(counts, "the weights' all-gather");
    const std::vector<int> at = displacements(n, "the weights' all-gather");
    MPI_Datatype element;
    check_mpi(MPI_Type_contiguous(static_cast<int>(element_bytes), MPI_BYTE, &element), "MPI_Type_contiguous");
    MPI_Type_commit(&element);
    MPI_Request request;
    const int status =
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, n.data(), at.data(), element, comm_, &request);
    if (status == MPI_SUCCESS) wait_for_ranks(request, "the weights' all-gather", comm_);
    MPI_Type_free(&element);
    check_mpi(status, "MPI_Iallgatherv");
  }
  void synchronize() override {}

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) { return std::make_unique<MpiCommunicator>(comm); }

#ifndef TANDEM_HAVE_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm) {
  throw std::runtime_error("this tandem was built without CUDA, so without NCCL");
}
#endif

}  // namespace tandem
