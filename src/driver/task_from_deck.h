// The task a deck asks for ([task]) and the prompt format its prompts are written in: the
// pretrained model's chat template when [model] path is set, else the compact form in the
// task's own alphabet.
#pragma once
#include <cstdint>
#include <memory>

#include "deck/deck.h"
#include "tasks/prompt_format.h"
#include "tasks/task.h"

namespace tandem {

std::unique_ptr<Task> task_from_deck(const Deck& deck);
PromptFormat prompt_format_from_deck(const Deck& deck, const Task& task);
// The longest prompt in ids: over every line of a prompt file, or over a sample of a
// generated task's prompts with room for longer draws.
int64_t longest_prompt_tokens(const Task& task, const PromptFormat& format);

}  // namespace tandem
