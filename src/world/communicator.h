// Collectives across the ranks of the job, on the memory of the rank's backend: NCCL on
// device pointers when ranks own GPUs, MPI on host pointers on the CPU backend. The
// training code calls these without knowing which one it has.
#pragma once
#include <cstddef>
#include <memory>
#include <mpi.h>
#include <span>

#include "tensor/tensor.h"

namespace tandem {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual Device device() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks; data lives on device().
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  // In place from root to all ranks; data lives on device().
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // ZeRO-1's two collectives over a buffer split into one contiguous range per rank, in
  // rank order, counts[r] elements for rank r (counts.size() == size(); unequal counts
  // allowed). Both are in place on device() memory holding the sum of the counts.
  // reduce_scatter_sum: this rank's range becomes the sum over ranks of that range; the
  // rest of data is left undefined.
  virtual void reduce_scatter_sum(float* data, std::span<const size_t> counts) = 0;
  // all_gather: every rank's range (elements of element_bytes each) reaches every rank.
  virtual void all_gather(void* data, std::span<const size_t> counts, size_t element_bytes) = 0;
  // Waits until the collectives issued so far have completed on this rank.
  virtual void synchronize() = 0;
};

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);
// Builds an NCCL communicator over comm: rank 0 creates the ncclUniqueId and broadcasts
// it over MPI. The calling rank must already be bound to its GPU.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm);

}  // namespace tandem
