#include "driver/trainer_checkpoint.h"

#include <algorithm>
#include <utility>

#include "tensor/device_copy.h"
#include "tensor/finite.h"
#include "train/muon.h"
#include "world/errors.h"
#include "world/stall_guard.h"

namespace tandem {

TrainerCheckpoint::TrainerCheckpoint(ColocatedMemory& memory, OptimizerKind optimizer, MPI_Comm comm)
    : memory_(memory), comm_(comm) {
  Slab master{memory.master(), {}}, exp_avg{memory.exp_avg(), {}}, exp_avg_sq{memory.exp_avg_sq(), {}};
  for (const ParameterInfo& info : memory.layout().tensors()) {
    master.tensors.push_back({"master." + info.name, &info});
    if (optimizer == OptimizerKind::Muon && takes_muon(info)) {
      exp_avg.tensors.push_back({"muon.momentum." + info.name, &info});
    } else {
      exp_avg.tensors.push_back({"adamw.exp_avg." + info.name, &info});
      exp_avg_sq.tensors.push_back({"adamw.exp_avg_sq." + info.name, &info});
    }
  }
  slabs_ = {std::move(master), std::move(exp_avg), std::move(exp_avg_sq)};
}

void TrainerCheckpoint::read(const Checkpoint& checkpoint) const {
  const int64_t begin = memory_.shard().begin();
  for (const Slab& slab : slabs_) {
    std::vector<float> host(static_cast<size_t>(memory_.layout().slab_elements()), 0.0f);
    for (const auto& [name, info] : slab.tensors) {
      const Tensor tensor = Tensor::view(host.data() + info->offset, DType::F32, Device::CPU, info->shape);
      checkpoint.read_tensor(name, tensor);  // verifies the tensor's checksum
      const std::string bad = describe_non_finite(tensor);
      if (!bad.empty()) throw BadInputError(checkpoint.path().string() + ": tensor '" + name + "': " + bad);
    }
    if (&slab == &slabs_.front())
      memory_.load_weights(host);
    else
      copy_host_to_tensor(slab.memory, host.data() + begin);
  }
}

size_t TrainerCheckpoint::host_floats() const {
  return slabs_.size() * static_cast<size_t>(memory_.layout().slab_elements());
}

void TrainerCheckpoint::gather_into(float* host) const {
  const SlabShards& shard = memory_.shard();
  const int64_t slab_elements = memory_.layout().slab_elements();
  if (shard.ranks() == 1) {  // every rank holds the whole slabs: rank 0's are written
    for (const Slab& slab : slabs_)
      if (host) copy_tensor_to_host(std::exchange(host, host + slab_elements), slab.memory);
    return;
  }
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  std::vector<float> own;  // a shard on its way to rank 0
  if (rank != 0) own.resize(static_cast<size_t>(shard.elements()));
  for (const Slab& slab : slabs_) {
    float* const whole = rank == 0 ? host : nullptr;
    copy_tensor_to_host(rank == 0 ? whole + shard.begin() : own.data(), slab.memory);
    if (rank == 0) host += slab_elements;
    // Point to point in slices (a whole slab's offsets pass MPI's int counts on large
    // models), every rank in each round: the stall guard's token ring keeps them in step.
    constexpr int64_t kSlice = int64_t{1} << 28;
    for (int r = 1; r < shard.ranks(); ++r) {
      const int64_t first = shard.bounds[static_cast<size_t>(r)], last = shard.bounds[static_cast<size_t>(r) + 1];
      for (int64_t at = first; at < last; at += kSlice) {
        const int count = static_cast<int>(std::min(kSlice, last - at));
        MPI_Request request = MPI_REQUEST_NULL;
        if (rank == 0)
          MPI_Irecv(whole + at, count, MPI_FLOAT, r, 0, comm_, &request);
        else if (rank == r)
          MPI_Isend(own.data() + (at - first), count, MPI_FLOAT, 0, 0, comm_, &request);
        wait_for_ranks(request, "the gathering of the optimizer shards for a checkpoint", comm_);
      }
    }
  }
}

void TrainerCheckpoint::add_to(CheckpointContents& contents, const float* host) const {
  for (const Slab& slab : slabs_) {
    for (const auto& [name, info] : slab.tensors)
      contents.tensors.push_back({name, Tensor::view(const_cast<float*>(host) + info->offset, DType::F32, Device::CPU, info->shape)});
    host += memory_.layout().slab_elements();
  }
}

}  // namespace tandem
