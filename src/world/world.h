// The MPI job as one rank sees it: who it is, which node-local slot it holds, which
// device it computes on, and the communicator for collectives on that device.
#pragma once
#include <memory>
#include <mpi.h>
#include <string>
#include <vector>

#include "world/communicator.h"
#include "world/errors.h"

namespace tandem {

struct WorldOptions {
  std::string device = "auto";  // auto | cpu | cuda
  int threads = 0;              // CPU threads per rank; 0 = the node's cores / local ranks
};

struct RankPlacement {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  std::string device;  // "cuda:0 (NVIDIA H200)" or "cpu (8 threads)"
};

class World {
 public:
  // MPI must be initialised. Binds this rank to its device (local rank -> GPU) and
  // builds the communicator; collective over `comm`, throws the same error on every rank.
  static std::unique_ptr<World> create(MPI_Comm comm, const WorldOptions& options);
  ~World();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  Device device() const { return device_; }
  int gpu() const { return gpu_; }  // -1 on the CPU backend
  int threads() const { return threads_; }
  MPI_Comm comm() const { return comm_; }
  Communicator& communicator() { return *communicator_; }
  // Every rank's placement, gathered at creation (same on every rank).
  const std::vector<RankPlacement>& placements() const { return placements_; }

 private:
  World() = default;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  Device device_ = Device::CPU;
  int gpu_ = -1;
  int threads_ = 1;
  std::unique_ptr<Communicator> communicator_;
  std::vector<RankPlacement> placements_;
};

// Collective: every rank passes its own error ("" when fine) and the exit code it calls
// for. If any rank failed, every rank throws the same RanksFailedError with the first
// failing rank's code, so no rank is left waiting in a later collective. Its message is
// the error once when every rank failed alike, else one line per line of each failing
// rank's error, "rank 1: ...". A `context` ("disk-delta baseline") leads every line.
void fail_together(MPI_Comm comm, const std::string& local_error, ExitCode code = kExitFailure,
                   const std::string& context = {});

// Runs `work` on every rank; an exception on any rank fails every rank together (above).
template <class Work>
void fail_together_on_error(MPI_Comm comm, Work&& work) {
  std::string error;
  ExitCode code = kExitDone;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
    code = exit_code_of(e);
  }
  fail_together(comm, error, code);
}

// Gathers one string per rank to every rank, waiting through the stall guard (`what` names
// the gathering when a rank does not arrive).
std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine, const char* what = "a gathering of messages");

}  // namespace tandem
