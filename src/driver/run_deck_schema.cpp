#include "driver/run_deck_schema.h"

#include "deck/options.h"
#include "deck/rules.h"
#include "driver/model_from_deck.h"
#include "rollout/engine.h"
#include "rollout/kv_cache.h"

namespace tandem {
namespace {

// The tiny model's sizes are in the deck, so --check can tell a KV cache too small for one
// block (a pretrained model's config.json is read at start-up, which checks it then).
// Device auto may land on either side, so the smaller working dtype (BF16) bounds it.
void kv_cache_holds_one_block(const Deck& deck) {
  if (!deck.get<std::string>("model.path").empty() || deck.get<double>("rollout.kv-cache-fraction") > 0) return;
  const std::string device = deck.get<std::string>("world.device");
  const DType dtype = device == "cpu" ? DType::F32 : working_dtype_from_deck(deck, Device::CUDA);
  const DType smallest = device == "auto" ? DType::BF16 : dtype;
  const int block_size = EngineOptions{}.block_size;
  size_t block_bytes = 0;
  try {
    const ModelConfig config = model_config_from_deck(deck);
    block_bytes = KvCacheGeometry{config.layers, config.kv_dim(), block_size, 1, smallest}.block_bytes();
  } catch (const std::invalid_argument&) {
    return;  // sizes that make no model: the model's own check reports them at start-up
  }
  const size_t bytes = deck.get<Bytes>("rollout.kv-cache").value;
  if (bytes >= block_bytes) return;
  throw DeckError(deck.source("rollout.kv-cache"), "rollout.kv-cache",
                  std::to_string(bytes) + " bytes do not hold one KV block of " +
                      std::to_string(block_size) + " tokens (" + std::to_string(block_bytes) +
                      " bytes for this model in " + dtype_name(smallest) + ")");
}

}  // namespace

const DeckSchema& run_deck_schema() {
  static const DeckSchema schema = [] {
    DeckSchema run{tandem_options(), tandem_rules()};
    run.rules.push_back(kv_cache_holds_one_block);
    return run;
  }();
  return schema;
}

}  // namespace tandem
