#include "train/optimizer_step.h"

#include "train/trainer_backend.h"

namespace tandem {

OptimizerStep::OptimizerStep(const ParameterLayout& layout, const PolicyTrainerMemory& memory, TrainerBackend& backend)
    : layout_(layout), muon_groups_(muon_groups(layout)), memory_(memory), backend_(backend) {}

size_t OptimizerStep::run(const OptimizerSettings& optimizer, double lr, int64_t step) {
  const bool muon = optimizer.kind == OptimizerKind::Muon;
  AdamWSettings adamw = optimizer.adamw;
  adamw.lr = lr;
  uint16_t* working = memory_.working.dtype == DType::BF16 ? memory_.working.ptr<uint16_t>() : nullptr;
  const MuonSettings muon_settings{lr, optimizer.momentum, optimizer.adamw.weight_decay};
  if (memory_.state_staging) return streamed(adamw, muon_settings, step, working, optimizer.kind);
  float* master = memory_.master.ptr<float>();
  const float* grads = memory_.grads.ptr<float>();
  for (const ParameterInfo& info : layout_.tensors()) {
    if (muon && takes_muon(info)) continue;
    const size_t offset = static_cast<size_t>(info.offset);
    backend_.adamw_step(master + offset, grads + offset, memory_.exp_avg.ptr<float>() + offset,
                        memory_.exp_avg_sq.ptr<float>() + offset, static_cast<size_t>(info.numel()),
                        adamw_scalars(adamw, step, info.shape.size() == 2), working ? working + offset : nullptr);
  }
  if (muon)
    for (const MuonGroup& group : muon_groups_) {
      backend_.muon_momentum(group, 0, group.matrices.size(), grads, memory_.exp_avg.ptr<float>(), {},
                             static_cast<float>(optimizer.momentum), memory_.activations);
      backend_.muon_orthogonalize(group, master, working, muon_scalars(muon_settings, group.m, group.n),
                                  memory_.activations);
    }
  return 0;
}

size_t OptimizerStep::streamed(const AdamWSettings& adamw, const MuonSettings& muon, int64_t step,
                                    uint16_t* working, OptimizerKind optimizer) {
  if (state_chunks_.empty() || state_chunks_optimizer_ != optimizer) {
    state_chunks_ = plan_state_chunks(layout_, optimizer, memory_.state_slot_elements);
    muon_chunks_ = optimizer == OptimizerKind::Muon ? plan_muon_chunks(muon_groups_, memory_.state_slot_elements)
                                                    : std::vector<MuonChunk>();
    state_chunks_optimizer_ = optimizer;
  }
  std::vector<StateTransfer> copies;
  size_t values = 0, chunk = 0;
  auto slot_of = [&](size_t c) { return memory_.state_staging + (c % 2) * memory_.state_slot_elements; };
  for (const StateChunk& planned : state_chunks_) {
    const int slot = static_cast<int>(chunk % 2);
    float* staging = slot_of(chunk++);
    copies.clear();
    for (const Tensor* moment : {&memory_.exp_avg, &memory_.exp_avg_sq})
      for (const AdamWPiece& piece : planned.pieces) {
        const StateTransfer copy{moment->ptr<float>() + piece.offset,
                                 moment == &memory_.exp_avg ? piece.exp_avg : piece.exp_avg_sq, piece.count};
        StateTransfer* last = copies.empty() ? nullptr : &copies.back();
        if (last && last->store + last->count == copy.store && last->staging_offset + last->count == copy.staging_offset)
          last->count += copy.count;  // adjacent in the slab and in the slot: one copy
        else
          copies.push_back(copy);
      }
    backend_.load_state(slot, staging, copies);
    for (const AdamWPiece& piece : planned.pieces) {
      const ParameterInfo& info = layout_.tensors()[piece.tensor];
      backend_.adamw_step(memory_.master.ptr<float>() + piece.offset, memory_.grads.ptr<float>() + piece.offset,
                           staging + piece.exp_avg, staging + piece.exp_avg_sq, piece.count,
                           adamw_scalars(adamw, step, info.shape.size() == 2),
                           working ? working + piece.offset : nullptr);
    }
    backend_.write_back_state(slot, staging, copies);
    values += 2 * planned.elements;
  }
  for (size_t m = 0; m < muon_chunks_.size(); ++m) {
    const MuonChunk& planned = muon_chunks_[m];
    const MuonGroup& group = muon_groups_[planned.group];
    const size_t elements = static_cast<size_t>(group.m * group.n);
    const int slot = static_cast<int>(chunk % 2);
    float* staging = slot_of(chunk++);
    copies.clear();
    for (size_t j = planned.first; j < planned.last; ++j)
      copies.push_back({memory_.exp_avg.ptr<float>() + group.matrices[j].offset,
                        static_cast<size_t>(planned.momentum[j - planned.first]), elements});
    backend_.load_state(slot, staging, copies);
    backend_.muon_momentum(group, planned.first, planned.last, memory_.grads.ptr<float>(), staging, planned.momentum,
                            static_cast<float>(muon.momentum), memory_.activations);
    backend_.write_back_state(slot, staging, copies);
    values += planned.elements;
    // The group's last chunk: every momentum is in, the products batch the whole group.
    if (m + 1 == muon_chunks_.size() || muon_chunks_[m + 1].group != planned.group)
      backend_.muon_orthogonalize(group, memory_.master.ptr<float>(), working, muon_scalars(muon, group.m, group.n),
                                   memory_.activations);
  }
  backend_.finish_state();
  return 2 * values * sizeof(float);
}

}  // namespace tandem
