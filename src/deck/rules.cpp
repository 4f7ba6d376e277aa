// Each rule names every key involved and reports at the one set last (the command line, else
// the latest line), since that is most often the edit that broke the agreement.
#include "deck/rules.h"

#include <algorithm>
#include <filesystem>

#include "tasks/jsonl_task.h"
#include "train/optimizer_settings.h"

namespace tandem {
namespace {

int recency(const Source& source) {
  switch (source.kind) {
    case Source::Kind::Default: return 0;
    case Source::Kind::File: return source.line;
    case Source::Kind::CommandLine: return 1 << 30;
  }
  return 0;
}

[[noreturn]] void contradiction(const Deck& deck, const std::vector<std::string>& keys, const std::string& reason) {
  const std::string blamed = *std::max_element(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    return recency(deck.source(a)) < recency(deck.source(b));
  });
  std::string values;
  for (const std::string& key : keys)
    values += (values.empty() ? "" : ", ") + key + " = " + deck.text(key) + " (" + deck.source(key).describe() + ")";
  throw DeckError(deck.source(blamed), blamed, reason + "; here " + values);
}

// Moving the handoff's peak onto the GPU only fits when each side has left the GPU first.
void gpu_peak_needs_both_offloads(const Deck& deck) {
  if (deck.get<std::string>("memory.colocate-memory-peak-device") != "gpu") return;
  if (deck.get<bool>("memory.offload-train") && deck.get<bool>("memory.offload-rollout")) return;
  contradiction(deck, {"memory.colocate-memory-peak-device", "memory.offload-train", "memory.offload-rollout"},
                "colocate-memory-peak-device = gpu needs offload-train = true and offload-rollout = true");
}

// Grouped-query attention shares each key/value head among heads / kv-heads query heads.
void heads_divisible_by_kv_heads(const Deck& deck) {
  if (deck.get<int64_t>("model.heads") % deck.get<int64_t>("model.kv-heads") == 0) return;
  contradiction(deck, {"model.heads", "model.kv-heads"}, "model.heads must be divisible by model.kv-heads");
}

void restart_is_auto_never_or_checkpoint(const Deck& deck) {
  const std::string restart = deck.get<std::string>("run.restart");
  if (restart == "auto" || restart == "never") return;
  const std::string expected = ": expected auto, never, or the path of an existing checkpoint file";
  if (!std::filesystem::exists(restart)) throw DeckError(deck.source("run.restart"), "run.restart", "missing file '" + restart + "'" + expected);
  if (std::filesystem::is_directory(restart)) throw DeckError(deck.source("run.restart"), "run.restart", "'" + restart + "' is a folder" + expected);
}

// The prompt file is read whole here, so a bad line is a deck error (file and line) on
// --check and at start-up alike. Its free-form text needs a pretrained model's tokenizer.
void jsonl_task_has_its_file_and_tokenizer(const Deck& deck) {
  if (deck.get<std::string>("task.name") != "jsonl") return;
  if (deck.get<std::string>("task.path").empty())
    contradiction(deck, {"task.name", "task.path"}, "task.name = jsonl reads its prompts from task.path: set it");
  if (deck.get<std::string>("model.path").empty())
    contradiction(deck, {"task.name", "model.path"},
                  "task.name = jsonl needs a pretrained model's tokenizer for its free-form text: set model.path");
  try {
    JsonlTaskSettings settings;
    settings.path = deck.get<std::string>("task.path");
    settings.match = answer_match_from_name(deck.get<std::string>("task.reward"));
    JsonlTask{settings};
  } catch (const std::runtime_error& error) {
    throw DeckError(deck.source("task.path"), "task.path", error.what());
  }
}

void optimizer_betas_are_two_fractions(const Deck& deck) {
  try {
    parse_betas(deck.get<std::string>("optimizer.betas"));
  } catch (const std::invalid_argument& error) {
    throw DeckError(deck.source("optimizer.betas"), "optimizer.betas", error.what());
  }
}

// The run's files go to <output-dir>/<name>: a name with a path in it would put them
// elsewhere (run.name = ../../x writes outside the output folder).
void run_name_is_a_plain_name(const Deck& deck) {
  const std::string name = deck.get<std::string>("run.name");
  if (!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos) return;
  throw DeckError(deck.source("run.name"), "run.name",
                  "'" + name + "' is not a plain name (no '/', not '.' or '..'): the run folder is <output-dir>/<name>; "
                  "put the path in run.output-dir");
}

// One sample per prompt is its own group mean: every advantage, and so the GRPO loss and
// its gradient, is zero, and the RL steps would spend the allocation learning nothing.
// Refused rather than warned, since --check can say so before the job is queued.
void group_size_gives_advantages(const Deck& deck) {
  if (deck.get<int64_t>("grpo.group-size") > 1 || deck.get<int64_t>("run.steps") <= deck.get<int64_t>("sft.steps")) return;
  contradiction(deck, {"grpo.group-size", "run.steps", "sft.steps"},
                "grpo.group-size = 1 gives every sample a zero advantage (a group of one is its own mean), so GRPO "
                "cannot learn: use 2 or more samples per prompt");
}

// ZeRO-1 keeps no whole copy of the FP32 master weights that the copy and disk-delta
// transports convert from: the all-gathered working copy, which the engine reads, is the
// one whole-slab copy of the weights.
void shard_optimizer_needs_alias_transport(const Deck& deck) {
  if (!deck.get<bool>("train.shard-optimizer") || deck.get<std::string>("sync.transport") == "alias") return;
  contradiction(deck, {"train.shard-optimizer", "sync.transport"},
                "train.shard-optimizer = true needs sync.transport = alias (the engine reads the all-gathered "
                "working copy; copy and disk-delta convert from whole master weights, which no rank holds)");
}

// Engines on rollout ranks have no trainer in their process to alias or copy from: they
// take the weights by broadcast or through disk deltas, and broadcast in turn needs ranks
// to broadcast to. (world.rollout-ranks against the number of ranks is checked at
// start-up, where the ranks are known.)
void rollout_ranks_use_a_transport_between_ranks(const Deck& deck) {
  const bool split = deck.get<int64_t>("world.rollout-ranks") > 0;
  const std::string transport = deck.get<std::string>("sync.transport");
  if (split ? transport == "broadcast" || transport == "disk-delta" : transport != "broadcast") return;
  contradiction(deck, {"world.rollout-ranks", "sync.transport"},
                split ? "rollout ranks get their weights by sync.transport = broadcast or disk-delta"
                      : "sync.transport = broadcast sends the weights to rollout ranks: set world.rollout-ranks > 0");
}

// Over-sampling draws rounds larger than the batch for dynamic sampling to choose from.
void over_sampling_serves_dynamic_sampling(const Deck& deck) {
  const int64_t over = deck.get<int64_t>("grpo.over-sampling-groups");
  if (over == 0) return;
  if (!deck.get<bool>("grpo.dynamic-sampling"))
    contradiction(deck, {"grpo.over-sampling-groups", "grpo.dynamic-sampling"},
                  "grpo.over-sampling-groups draws extra prompts for dynamic sampling to choose from: set grpo.dynamic-sampling = true");
  if (over < deck.get<int64_t>("task.prompts-per-step"))
    contradiction(deck, {"grpo.over-sampling-groups", "task.prompts-per-step"},
                  "a round of grpo.over-sampling-groups prompts per rank must hold the rank's batch of task.prompts-per-step");
  // A round sampled ahead runs whole while the trainers train: nobody decides its batch.
  if (deck.get<int64_t>("rollout.max-staleness") > 0)
    contradiction(deck, {"grpo.over-sampling-groups", "rollout.max-staleness"},
                  "a round with grpo.over-sampling-groups ends once trainer rank 0 decides its batch, which a round "
                  "sampled ahead under rollout.max-staleness = 1 cannot: set one of them to 0");
}

// A colocated rank's device runs its engine or its trainer, one at a time: only rollout
// ranks can sample while the trainers train.
void staleness_needs_rollout_ranks(const Deck& deck) {
  if (deck.get<int64_t>("rollout.max-staleness") == 0 || deck.get<int64_t>("world.rollout-ranks") > 0) return;
  contradiction(deck, {"rollout.max-staleness", "world.rollout-ranks"},
                "rollout.max-staleness = 1 samples the next step on rollout ranks while the trainers train: set "
                "world.rollout-ranks > 0 (a colocated rank runs its engine and its trainer one at a time)");
}

}  // namespace

const std::vector<DeckRule>& tandem_rules() {
  static const std::vector<DeckRule> rules = {
      gpu_peak_needs_both_offloads,
      heads_divisible_by_kv_heads,
      restart_is_auto_never_or_checkpoint,
      jsonl_task_has_its_file_and_tokenizer,
      optimizer_betas_are_two_fractions,
      run_name_is_a_plain_name,
      group_size_gives_advantages,
      shard_optimizer_needs_alias_transport,
      rollout_ranks_use_a_transport_between_ranks,
      over_sampling_serves_dynamic_sampling,
      staleness_needs_rollout_ranks,
  };
  return rules;
}

}  // namespace tandem
