// The rollout side a deck asks for, shared by colocated ranks and rollout ranks: the task
// and prompt format (task_from_deck.h), how its groups are sampled, and the engine's options.
#pragma once
#include <cstdint>
#include <memory>

#include "deck/deck.h"
#include "driver/group_sampler.h"
#include "driver/task_from_deck.h"
#include "rollout/engine.h"
#include "tasks/prompt_format.h"
#include "tasks/task.h"

namespace tandem {

// The longest sequence a step holds: the task's longest prompt and a whole completion.
int64_t sequence_tokens_from_deck(const Deck& deck, const Task& task, const PromptFormat& format);
GroupSamplingSettings group_sampling_from_deck(const Deck& deck, const PromptFormat& format);
// An engine that runs up to `sequences` requests at once, of up to sequence_tokens_from_deck
// tokens each, in `dtype`.
EngineOptions engine_options_from_deck(const Deck& deck, const Task& task, const PromptFormat& format, int64_t sequences,
                                       DType dtype, Device device);

}  // namespace tandem
