#include "world/roles.h"

#include <stdexcept>

#include "world/stall_guard.h"

namespace tandem {

namespace {

std::unique_ptr<Communicator> device_communicator(Device device, MPI_Comm comm) {
  return device == Device::CUDA ? make_nccl_communicator(comm) : make_mpi_communicator(comm);
}

}  // namespace

Roles::Roles(World& world, int rollout_ranks) : world_(world), engines_(rollout_ranks) {
  if (rollout_ranks < 0 || rollout_ranks >= world.size())
    throw std::invalid_argument(std::to_string(rollout_ranks) + " rollout ranks leave no trainer among " +
                                std::to_string(world.size()) + " ranks");
  trainers_ = world.size() - engines_;
  if (engines_ == 0) {
    comm_ = world.comm();
    rank_ = world.rank();
    size_ = world.size();
    return;
  }
  role_ = world.rank() < trainers_ ? Role::Trainer : Role::Engine;
  MPI_Comm_split(world.comm(), role_ == Role::Engine, world.rank(), &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const bool on_link = role_ == Role::Engine || world.rank() == 0;
  MPI_Comm_split(world.comm(), on_link ? 0 : MPI_UNDEFINED, world.rank(), &link_);
  // The groups run their own collectives: each gets its own stall-guard ring.
  guard_collectives_on(comm_);
  if (link_ != MPI_COMM_NULL) guard_collectives_on(link_);
  std::string error;
  try {
    communicator_ = device_communicator(world.device(), comm_);
    if (link_ != MPI_COMM_NULL) link_communicator_ = device_communicator(world.device(), link_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  fail_together(world.comm(), error);
}

Roles::~Roles() {
  communicator_.reset();
  link_communicator_.reset();
  if (!split()) return;
  for (MPI_Comm* comm : {&comm_, &link_}) {
    if (*comm == MPI_COMM_NULL) continue;
    stop_guarding(*comm);
    MPI_Comm_free(comm);
  }
}

std::string Roles::role_of(int world_rank) const {
  if (!split()) return "trainer + rollout";
  return world_rank < trainers_ ? "trainer" : "rollout";
}

}  // namespace tandem
