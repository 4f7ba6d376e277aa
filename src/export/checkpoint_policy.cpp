#include "export/checkpoint_policy.h"

#include "deck/deck.h"
#include "driver/model_from_deck.h"
#include "io/checkpoint.h"
#include "model/parameters.h"

namespace tandem {

CheckpointPolicy load_checkpoint_policy(const std::filesystem::path& path) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  const Deck deck = Deck::load_text(checkpoint.deck_text(), path.string() + ": /deck", {});
  CheckpointPolicy policy;
  policy.config = model_config_from_deck(deck);
  policy.origin = deck.get<std::string>("model.path");
  const ParameterLayout layout(policy.config);
  policy.weights.assign(static_cast<size_t>(layout.slab_elements()), 0.0f);
  // run_job writes the trainer's master weights under this prefix, next to adamw.*.
  for (const ParameterInfo& info : layout.tensors())
    checkpoint.read_tensor("master." + info.name,
                           Tensor::view(policy.weights.data() + info.offset, DType::F32, Device::CPU, info.shape));
  return policy;
}

}  // namespace tandem
