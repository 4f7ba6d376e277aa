#include "train/optimizer_step.h"

#include "train/trainer_backend.h"

namespace tandem {

OptimizerStep::OptimizerStep(const ParameterLayout& layout, const SlabShards& shard, const PolicyTrainerMemory& memory,
                             TrainerBackend& backend)
    : layout_(layout),
      shard_(shard),
      memory_(memory),
      backend_(backend),
      grads_(memory.grads.ptr<float>() + shard.begin()),
      working_(memory.working.dtype == DType::BF16 ? memory.working.ptr<uint16_t>() + shard.begin() : nullptr) {}

void OptimizerStep::plan(OptimizerKind optimizer) {
  if (planned_ && planned_optimizer_ == optimizer) return;
  const bool muon = optimizer == OptimizerKind::Muon;
  adamw_pieces_ = adamw_pieces(layout_, optimizer, shard_);
  // With the state on the device, neighbours in the slab with the same decay step as one run.
  adamw_runs_.clear();
  for (const SlabPiece& piece : memory_.state_staging ? std::span<const SlabPiece>() : adamw_pieces_) {
    const bool decayed = layout_.tensors()[piece.tensor].shape.size() == 2;
    AdamWRun* last = adamw_runs_.empty() ? nullptr : &adamw_runs_.back();
    if (last && last->decayed == decayed && last->offset + last->count == piece.offset)
      last->count += piece.count;
    else
      adamw_runs_.push_back({piece.offset, piece.count, decayed});
  }
  muon_groups_ = muon ? muon_groups_in(layout_, shard_) : std::vector<MuonGroup>();
  if (memory_.state_staging) {
    state_chunks_ = plan_state_chunks(adamw_pieces_, memory_.state_slot_elements);
    muon_chunks_ = plan_muon_chunks(muon_groups_, memory_.state_slot_elements);
  }
  planned_ = true;
  planned_optimizer_ = optimizer;
}

size_t OptimizerStep::run(const OptimizerSettings& optimizer, double lr, int64_t step) {
  plan(optimizer.kind);
  AdamWSettings adamw = optimizer.adamw;
  adamw.lr = lr;
  const MuonSettings muon_settings{lr, optimizer.momentum, optimizer.adamw.weight_decay};
  if (memory_.state_staging) return streamed(adamw, muon_settings, step, working_);
  float* master = memory_.master.ptr<float>();
  backend_.adamw_step_runs(master, grads_, memory_.exp_avg.ptr<float>(), memory_.exp_avg_sq.ptr<float>(), adamw_runs_,
                           adamw_scalars(adamw, step, true), adamw_scalars(adamw, step, false), working_);
  for (const MuonGroup& group : muon_groups_) {
    backend_.muon_momentum(group, 0, group.matrices.size(), grads_, memory_.exp_avg.ptr<float>(), {},
                           static_cast<float>(optimizer.momentum), memory_.activations);
    backend_.muon_orthogonalize(group, master, working_, muon_scalars(muon_settings, group.m, group.n),
                                memory_.activations);
  }
  return 0;
}

size_t OptimizerStep::streamed(const AdamWSettings& adamw, const MuonSettings& muon, int64_t step,
                               uint16_t* working) {
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
      backend_.adamw_step(memory_.master.ptr<float>() + piece.offset, grads_ + piece.offset,
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
    backend_.muon_momentum(group, planned.first, planned.last, grads_, staging, planned.momentum,
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
