#include "world/world.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "world/gpu.h"
#include "world/stall_guard.h"

namespace tandem {

std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine, const char* what) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), offsets(size);
  all_gather(&length, 1, MPI_INT, lengths.data(), comm, what);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  MPI_Request request;
  MPI_Iallgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm, &request);
  wait_for_ranks(request, what, comm);
  std::vector<std::string> result(size);
  for (int r = 0; r < size; ++r) result[r] = all.substr(offsets[r], lengths[r]);
  return result;
}

void fail_together(MPI_Comm comm, const std::string& local_error, ExitCode code, const std::string& context) {
  const auto errors = all_gather_strings(comm, local_error, "the gathering of errors");
  const auto codes = all_gather_strings(comm, std::to_string(static_cast<int>(code)), "the gathering of errors");
  const auto failed = std::find_if(errors.begin(), errors.end(), [](const std::string& e) { return !e.empty(); });
  if (failed == errors.end()) return;
  const ExitCode first_code = static_cast<ExitCode>(std::stoi(codes[failed - errors.begin()]));
  const std::string lead = context.empty() ? "" : context + ": ";
  // Every rank failed alike (a bad deck, a missing file): the message once, no rank named.
  const bool alike = std::all_of(errors.begin(), errors.end(), [&](const std::string& e) { return e == errors[0]; });
  std::string message;
  for (size_t r = 0; r < (alike ? 1 : errors.size()); ++r) {
    std::istringstream lines(errors[r]);
    for (std::string line; std::getline(lines, line);)
      message += (message.empty() ? "" : "\n") + lead + (alike ? "" : "rank " + std::to_string(r) + ": ") + line;
  }
  throw RanksFailedError(first_code, message);
}

namespace {
std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}
}  // namespace

std::unique_ptr<World> World::create(MPI_Comm comm, const WorldOptions& options) {
  std::unique_ptr<World> world(new World());
  world->comm_ = comm;
  MPI_Comm_rank(comm, &world->rank_);
  MPI_Comm_size(comm, &world->size_);
  // Ranks sharing a node (shared memory) get consecutive local ranks: local rank -> GPU.
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, world->rank_, MPI_INFO_NULL, &world->local_comm_);
  MPI_Comm_rank(world->local_comm_, &world->local_rank_);
  MPI_Comm_size(world->local_comm_, &world->local_size_);

  std::string error;
  std::string device_text;
  try {
    if (options.device != "auto" && options.device != "cpu" && options.device != "cuda")
      throw std::invalid_argument("device must be auto, cpu or cuda, not '" + options.device + "'");
    const int gpus = options.device == "cpu" ? 0 : gpu_count();
    if (options.device == "cuda" && gpus == 0)
      throw std::runtime_error("device = cuda but no usable GPU on host " + host_name() +
                               " (no driver, no device, or a CPU-only build)");
    if (gpus > 0) {
      if (world->local_rank_ >= gpus)
        throw std::runtime_error("host " + host_name() + " has " + std::to_string(gpus) + " GPU(s) but " +
                                 std::to_string(world->local_size_) +
                                 " ranks on it; start at most one rank per GPU (local rank " +
                                 std::to_string(world->local_rank_) + " has none)");
      world->device_ = Device::CUDA;
      world->gpu_ = world->local_rank_;
      bind_gpu(world->gpu_);
      device_text = "cuda:" + std::to_string(world->gpu_) + " (" + gpu_info(world->gpu_).name + ")";
    }
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    world->threads_ = options.threads > 0 ? options.threads : std::max(1, cores / world->local_size_);
    omp_set_num_threads(world->threads_);
    if (world->device_ == Device::CPU) device_text = "cpu (" + std::to_string(world->threads_) + " threads)";
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_together(comm, error);

  // Every rank must agree on the backend, or collectives would mix NCCL and MPI.
  int is_cuda = world->device_ == Device::CUDA, all_cuda = 0, any_cuda = 0;
  MPI_Allreduce(&is_cuda, &all_cuda, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&is_cuda, &any_cuda, 1, MPI_INT, MPI_MAX, comm);
  if (all_cuda != any_cuda)
    throw std::runtime_error("some ranks found a GPU and others did not; set world.device explicitly");

  try {
    world->communicator_ = world->device_ == Device::CUDA ? make_nccl_communicator(comm) : make_mpi_communicator(comm);
    error.clear();
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_together(comm, error);

  const auto hosts = all_gather_strings(comm, host_name());
  const auto devices = all_gather_strings(comm, device_text);
  const auto locals = all_gather_strings(comm, std::to_string(world->local_rank_));
  for (int r = 0; r < world->size_; ++r)
    world->placements_.push_back({r, hosts[r], std::stoi(locals[r]), devices[r]});
  return world;
}

World::~World() {
  communicator_.reset();
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
}

}  // namespace tandem
