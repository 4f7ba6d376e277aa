#include "driver/engine_rank.h"

#include <optional>

#include "driver/engine_orders.h"
#include "driver/rollout_from_deck.h"
#include "driver/transport_from_deck.h"
#include "tensor/memory_pool.h"
#include "world/log.h"
#include "world/stop_point.h"

namespace tandem {

int run_engine_rank(const Deck& deck, World& world, Roles& roles, const ModelConfig& model, const ParameterLayout& layout,
                    DType working_dtype) {
  PoolOptions pool_options;
  pool_options.pinned_host_cache = deck.get<bool>("memory.pinned-host-cache");
  auto pool = MemoryPool::create(world.device(), std::max(world.gpu(), 0), pool_options);
  const std::unique_ptr<WeightTransport> weights = engine_transport_from_deck(deck, *pool, layout, working_dtype, world, roles);
  const std::unique_ptr<Task> task = task_from_deck(deck);
  const PromptFormat format = prompt_format_from_deck(deck, *task);
  // A round holds prompts-per-step groups per trainer; this engine runs every K-th one.
  const int64_t round = roles.trainers() * deck.get<int64_t>("task.prompts-per-step");
  const int64_t groups = (round + roles.engines() - 1) / roles.engines();
  const EngineOptions options = engine_options_from_deck(deck, *task, format, groups * deck.get<int64_t>("grpo.group-size"),
                                                         working_dtype, world.device());
  Engine engine(model, ParameterSet::bind(layout, weights->engine_weights().data, working_dtype, world.device()), *pool,
                options, &format.tokenizer());
  LocalGroupSampler sampler(engine, *task, format, group_sampling_from_deck(deck, format));
  const std::string name = "rollout rank " + std::to_string(world.rank());
  std::optional<StopPoint> stop_point;
  for (;;) {
    const EngineCommand command = broadcast_command(roles.link(), {});
    switch (command.order) {
      case EngineOrder::Round: {
        std::string reply;
        try {
          reply = groups_reply(sampler.sample_prompts(command.step, engine_share(command, roles.rank(), roles.engines())));
        } catch (const std::exception& e) {
          reply = error_reply(exit_code_of(e), name + ": " + e.what());
        }
        gather_round(roles.link(), reply);  // an engine's error fails every rank
        break;
      }
      case EngineOrder::Sync: weights->sync(); break;
      case EngineOrder::StartStopPoint: stop_point.emplace(world.comm(), std::nullopt); break;
      case EngineOrder::StepBoundary: stop_point->agree(); break;
      case EngineOrder::Finish: return kExitDone;
      case EngineOrder::TrainersFailed:
        // The trainers exit with the failure's code and rank 0 logs it; this rank's clean
        // exit leaves the job's code to theirs.
        TLOG(warning) << name << ": the trainer ranks failed; leaving";
        return kExitDone;
    }
  }
}

}  // namespace tandem
