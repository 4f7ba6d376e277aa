#include "driver/run_deck_schema.h"

#include "deck/options.h"
#include "deck/rules.h"
#include "driver/model_from_deck.h"
#include "driver/task_from_deck.h"
#include "rollout/engine.h"
#include "rollout/kv_cache.h"

namespace tandem {
namespace {

// The tiny model's sizes are in the deck, so --check can tell a KV cache too small for one
// block (a pretrained model's config.json is read at start-up, which checks it then).
// Device auto may land on either side, so the smaller working dtype (BF16) bounds it; an
// FP8 cache is smaller still.
void kv_cache_holds_one_block(const Deck& deck) {
  if (!deck.get<std::string>("model.path").empty() || deck.get<double>("rollout.kv-cache-fraction") > 0) return;
  const std::string device = deck.get<std::string>("world.device");
  const DType dtype = device == "cpu" ? DType::F32 : working_dtype_from_deck(deck, Device::CUDA);
  const DType smallest = deck.get<std::string>("rollout.kv-cache-dtype") == "fp8" ? DType::F8_E4M3
                         : device == "auto"                                       ? DType::BF16
                                                                                  : dtype;
  const int block_size = EngineOptions{}.block_size;
  size_t block_bytes = 0;
  try {
    const ModelConfig config = model_config_from_deck(deck);
    block_bytes = KvCacheGeometry::for_blocks(config, 1, block_size, smallest).block_bytes();
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

// A model from scratch writes its prompts in the task's own alphabet, which the deck
// alone gives: --check can tell a micro-batch too small for one sequence.
void micro_batch_holds_a_sequence(const Deck& deck) {
  if (!deck.get<std::string>("model.path").empty() || deck.get<int64_t>("train.micro-batch-tokens") == 0) return;
  const auto task = task_from_deck(deck);
  require_micro_batch_holds_a_sequence(
      deck, longest_prompt_tokens(*task, prompt_format_from_deck(deck, *task)) + deck.get<int64_t>("grpo.max-new-tokens"));
}

}  // namespace

void require_micro_batch_holds_a_sequence(const Deck& deck, int64_t sequence_tokens) {
  const int64_t micro_batch = deck.get<int64_t>("train.micro-batch-tokens");
  if (micro_batch == 0 || micro_batch >= sequence_tokens) return;
  throw DeckError(deck.source("train.micro-batch-tokens"), "train.micro-batch-tokens",
                  std::to_string(micro_batch) + " tokens do not hold one sequence: at least " +
                      std::to_string(sequence_tokens) + " (a prompt of up to " +
                      std::to_string(sequence_tokens - deck.get<int64_t>("grpo.max-new-tokens")) +
                      " tokens + grpo.max-new-tokens = " + deck.text("grpo.max-new-tokens") + ")");
}

const DeckSchema& run_deck_schema() {
  static const DeckSchema schema = [] {
    DeckSchema run{tandem_options(), tandem_rules()};
    run.rules.push_back(kv_cache_holds_one_block);
    run.rules.push_back(micro_batch_holds_a_sequence);
    return run;
  }();
  return schema;
}

}  // namespace tandem
