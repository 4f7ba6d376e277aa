// Which ranks train and which generate. Colocated (no rollout ranks): every rank does
// both, and its group is the whole job. With K rollout ranks the last K ranks of the job
// run rollout engines only and the others train only, each group with its communicator
// (MPI_Comm_split): the trainers' for the data-parallel gradient all-reduce, the engines'.
// The link joins trainer rank 0 (its rank 0) and the engines: it carries trainer 0's
// orders, the sampled groups and the weight broadcast.
#pragma once
#include <memory>
#include <mpi.h>
#include <string>

#include "world/communicator.h"
#include "world/world.h"

namespace tandem {

enum class Role { Colocated, Trainer, Engine };

class Roles {
 public:
  // Collective over the world's ranks; rollout_ranks must be below the world's size.
  Roles(World& world, int rollout_ranks);
  ~Roles();
  Roles(const Roles&) = delete;
  Roles& operator=(const Roles&) = delete;

  Role role() const { return role_; }
  bool split() const { return role_ != Role::Colocated; }
  int trainers() const { return trainers_; }
  int engines() const { return engines_; }
  // This rank's group: its communicator, rank and size in it, and its collectives on the
  // device (the world's own when colocated).
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  Communicator& communicator() { return communicator_ ? *communicator_ : world_.communicator(); }
  // Trainer rank 0 and the engines; MPI_COMM_NULL on the other trainers and when colocated.
  MPI_Comm link() const { return link_; }
  Communicator* link_communicator() { return link_communicator_.get(); }
  // "trainer", "rollout" or "trainer + rollout", for the start-up table.
  std::string role_of(int world_rank) const;

 private:
  World& world_;
  Role role_ = Role::Colocated;
  int trainers_ = 0, engines_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL, link_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Communicator> communicator_, link_communicator_;
};

}  // namespace tandem
