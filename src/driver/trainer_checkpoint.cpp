#include "driver/trainer_checkpoint.h"

#include "tensor/device_copy.h"
#include "tensor/finite.h"
#include "train/muon.h"
#include "world/errors.h"

namespace tandem {

TrainerCheckpoint::TrainerCheckpoint(const ColocatedMemory& memory, OptimizerKind optimizer) {
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
  for (const Slab& slab : slabs_) {
    std::vector<float> host(static_cast<size_t>(slab.memory.numel()), 0.0f);
    for (const auto& [name, info] : slab.tensors) {
      const Tensor tensor = Tensor::view(host.data() + info->offset, DType::F32, Device::CPU, info->shape);
      checkpoint.read_tensor(name, tensor);  // verifies the tensor's checksum
      const std::string bad = describe_non_finite(tensor);
      if (!bad.empty()) throw BadInputError(checkpoint.path().string() + ": tensor '" + name + "': " + bad);
    }
    copy_host_to_tensor(slab.memory, host.data());
  }
}

size_t TrainerCheckpoint::host_floats() const {
  size_t floats = 0;
  for (const Slab& slab : slabs_) floats += static_cast<size_t>(slab.memory.numel());
  return floats;
}

void TrainerCheckpoint::add_to(CheckpointContents& contents, float* host) const {
  for (const Slab& slab : slabs_) {
    copy_tensor_to_host(host, slab.memory);
    for (const auto& [name, info] : slab.tensors)
      contents.tensors.push_back({name, Tensor::view(host + info->offset, DType::F32, Device::CPU, info->shape)});
    host += slab.memory.numel();
  }
}

}  // namespace tandem
