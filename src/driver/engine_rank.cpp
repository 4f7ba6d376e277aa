#include "driver/engine_rank.h"

#include <memory>
#include <optional>
#include <utility>

#include "driver/engine_orders.h"
#include "driver/round_stream.h"
#include "driver/rollout_from_deck.h"
#include "driver/transport_from_deck.h"
#include "tensor/memory_pool.h"
#include "world/log.h"
#include "world/stop_point.h"
#include "world/stop_signals.h"

namespace tandem {

namespace {

// What a rollout rank builds at start-up: its memory, the weights its transport fills, the
// task and the engine that samples it.
struct RolloutRankEngine {
  RolloutRankEngine(const Deck& deck, World& world, Roles& roles, const ModelConfig& model, const ParameterLayout& layout,
                    DType working_dtype)
      : pool(MemoryPool::create(world.device(), std::max(world.gpu(), 0),
                                PoolOptions{.pinned_host_cache = deck.get<bool>("memory.pinned-host-cache")})),
        weights(engine_transport_from_deck(deck, *pool, layout, working_dtype, world, roles)),
        task(task_from_deck(deck)),
        format(prompt_format_from_deck(deck, *task)) {
    // A round holds prompts-per-step groups per trainer; this engine runs every K-th one.
    const int64_t round = roles.trainers() * deck.get<int64_t>("task.prompts-per-step");
    const int64_t groups = (round + roles.engines() - 1) / roles.engines();
    const EngineOptions options = engine_options_from_deck(deck, *task, format, groups * deck.get<int64_t>("grpo.group-size"),
                                                           working_dtype, world.device());
    engine = std::make_unique<Engine>(model, ParameterSet::bind(layout, weights->engine_weights().data, working_dtype, world.device()),
                                      *pool, options, &format.tokenizer());
    sampler = std::make_unique<LocalGroupSampler>(*engine, *task, format, group_sampling_from_deck(deck, format));
  }
  std::unique_ptr<MemoryPool> pool;  // first, so that it outlives the engine's KV cache
  std::unique_ptr<WeightTransport> weights;
  std::unique_ptr<Task> task;
  PromptFormat format;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<LocalGroupSampler> sampler;
};

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
  // An engine's error fails every rank.
  stream.close(aborted, static_cast<int64_t>(engine.running() + engine.waiting()), sampler.take_graph_setup_seconds());
}

}  // namespace

int run_engine_rank(const Deck& deck, World& world, Roles& roles, const ModelConfig& model, const ParameterLayout& layout,
                    DType working_dtype) {
  const std::string name = "rollout rank " + std::to_string(world.rank());
  // A start-up error waits for trainer rank 0's first order, ReportStartUp, so that every
  // rank fails together (or TrainersFailed, when the trainers failed at start-up too).
  std::unique_ptr<RolloutRankEngine> built;
  std::string startup_error;
  try {
    built = std::make_unique<RolloutRankEngine>(deck, world, roles, model, layout, working_dtype);
  } catch (const std::exception& e) {
    TLOG(error) << name << ": start-up: " << e.what();
    startup_error = error_reply(exit_code_of(e), name + ": start-up: " + e.what());
  }
  std::optional<StopPoint> stop_point;
  // The round sampled and not yet collected: the reply, and what its graph setup cost.
  struct KeptRound {
    std::string reply;
    double graph_setup_seconds = 0;
  } kept;
  for (;;) {
    const EngineCommand command = broadcast_command(roles.link(), {});
    switch (command.order) {
      case EngineOrder::ReportStartUp: fail_together_on_link(roles.link(), startup_error); break;
      case EngineOrder::Round:
        try {
          kept = {groups_reply(built->sampler->sample_prompts(command.step,
                                                               engine_share(command, roles.rank(), roles.engines()))),
                  built->sampler->take_graph_setup_seconds()};
        } catch (const std::exception& e) {
          kept = {error_reply(exit_code_of(e), name + ": " + e.what())};
        }
        break;
      case EngineOrder::StreamedRound: serve_round(command, *built->sampler, *built->engine, roles, name); break;
      case EngineOrder::Collect: {  // an error fails every rank
        const KeptRound round = std::exchange(kept, {});
        gather_round(roles.link(), round.reply, round.graph_setup_seconds);
        break;
      }
      case EngineOrder::Discard: kept = {}; break;
      case EngineOrder::Sync: built->weights->sync(); break;
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
