#include "driver/engine_rank.h"

#include <optional>

#include "driver/engine_orders.h"
#include "driver/round_stream.h"
#include "driver/rollout_from_deck.h"
#include "sync/broadcast_transport.h"
#include "tensor/memory_pool.h"
#include "world/log.h"
#include "world/stop_point.h"
#include "world/stop_signals.h"

namespace tandem {

namespace {

// Samples this engine's share of a round, streaming each scored group to trainer rank 0,
// until the share is done or trainer rank 0 ends the round; a stop signal received
// meanwhile goes to trainer rank 0, which cuts the round on every engine.
void serve_round(const EngineCommand& round, LocalGroupSampler& sampler, const Engine& engine, const Roles& roles,
                 const std::string& name) {
  EngineRound stream(roles.link());
  int64_t aborted = 0;
  try {
    aborted = sampler.stream(
        round.step, engine_share(round, roles.rank(), roles.engines()),
        [&](SampledGroup&& group) { stream.send_group(group); },
        [&] {
          if (const int signal = stop_signal_received()) stream.send_stop(signal_name(signal) + " received on " + name);
          return stream.ended();
        });
  } catch (const std::exception& e) {
    stream.fail(exit_code_of(e), name + ": " + e.what());
  }
  stream.close(aborted, static_cast<int64_t>(engine.running() + engine.waiting()));  // an engine's error fails every rank
}

}  // namespace

int run_engine_rank(const Deck& deck, World& world, Roles& roles, const ModelConfig& model, const ParameterLayout& layout,
                    DType working_dtype) {
  PoolOptions pool_options;
  pool_options.pinned_host_cache = deck.get<bool>("memory.pinned-host-cache");
  auto pool = MemoryPool::create(world.device(), std::max(world.gpu(), 0), pool_options);
  BroadcastTransport weights(*pool, layout, working_dtype,
                             BroadcastSettings{deck.get<Bytes>("sync.bucket-bytes").value, roles.link_communicator()}, nullptr);
  const std::unique_ptr<Task> task = task_from_deck(deck);
  const PromptFormat format = prompt_format_from_deck(deck, *task);
  // A round holds prompts-per-step groups per trainer; this engine runs every K-th one.
  const int64_t round = roles.trainers() * deck.get<int64_t>("task.prompts-per-step");
  const int64_t groups = (round + roles.engines() - 1) / roles.engines();
  const EngineOptions options = engine_options_from_deck(deck, *task, format, groups * deck.get<int64_t>("grpo.group-size"),
                                                         working_dtype, world.device());
  Engine engine(model, ParameterSet::bind(layout, weights.engine_weights().data, working_dtype, world.device()), *pool,
                options, &format.tokenizer());
  LocalGroupSampler sampler(engine, *task, format, group_sampling_from_deck(deck, format));
  const std::string name = "rollout rank " + std::to_string(world.rank());
  std::optional<StopPoint> stop_point;
  for (;;) {
    const EngineCommand command = broadcast_command(roles.link(), {});
    switch (command.order) {
      case EngineOrder::Round: serve_round(command, sampler, engine, roles, name); break;
      case EngineOrder::Sync: weights.sync(); break;
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
