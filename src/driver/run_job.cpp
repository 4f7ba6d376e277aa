#include "driver/run_job.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "driver/checkpoint_writer.h"
#include "driver/colocated_memory.h"
#include "driver/engine_rank.h"
#include "driver/remote_rollout.h"
#include "driver/grpo_step.h"
#include "driver/handoff_plan.h"
#include "driver/model_from_deck.h"
#include "driver/memory_plan.h"
#include "driver/phase_memory.h"
#include "driver/optimizer_from_deck.h"
#include "driver/trainer_checkpoint.h"
#include "driver/transport_from_deck.h"
#include "driver/non_finite_step.h"
#include "driver/resume.h"
#include "deck/deck_diff.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/run_file_copy.h"
#include "rollout/engine_forward.h"
#include "tensor/finite.h"
#include "train/entropy_watch.h"
#include "world/errors.h"
#include "report/report_html.h"
#include "world/gpu.h"
#include "world/host_memory.h"
#include "world/log.h"
#include "world/phase_timers.h"
#include "world/slurm_end_time.h"
#include "world/stall_guard.h"
#include "world/stop_point.h"
#include "world/roles.h"
#include "world/table.h"
#include "world/world.h"
#include "world/version.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

std::string now_iso8601() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
  return text;
}

HandoffConfig handoff_config_from_deck(const Deck& deck) {
  HandoffConfig config;
  config.offload_train = deck.get<bool>("memory.offload-train");
  config.offload_rollout = deck.get<bool>("memory.offload-rollout");
  const auto level = deck.get<std::vector<std::string>>("memory.offload-rollout-level");
  config.level_kv_cache = std::find(level.begin(), level.end(), "kv_cache") != level.end();
  config.level_weight = std::find(level.begin(), level.end(), "weight") != level.end();
  config.peak_device = deck.get<std::string>("memory.colocate-memory-peak-device") == "gpu" ? PeakDevice::Gpu : PeakDevice::Cpu;
  config.weights_shared = transport_kind_from_name(deck.get<std::string>("sync.transport")) == TransportKind::Alias;
  config.optimizer_off_device = deck.get<std::string>("optimizer.state") != "device";
  if (deck.get<int64_t>("world.rollout-ranks") > 0) {  // a trainer rank holds no engine: nothing to hand off
    config.offload_train = config.offload_rollout = false;
    config.peak_device = PeakDevice::Cpu;
  }
  return config;
}

std::string startup_table(const World& world, const Roles& roles, const Deck& deck, const ModelConfig& model,
                          const ParameterLayout& layout, DType working_dtype, const fs::path& folder, const SlabShards& shard) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"version", std::string(tandem_version()) + " (" + tandem_git_revision() + ")"},
      {"run folder", folder.string()},
      {"ranks", std::to_string(world.size())},
      {"backend", world.device() == Device::CUDA ? "cuda (NCCL collectives)" : "cpu (MPI collectives)"},
      {"", ""},
  };
  for (const RankPlacement& p : world.placements())
    rows.push_back({"rank " + std::to_string(p.rank),
                    p.host + " local " + std::to_string(p.local_rank) + " " + p.device + ", " + roles.role_of(p.rank)});
  rows.push_back({"", ""});
  rows.push_back({"model", deck.get<std::string>("model.path").empty() ? "tiny " + std::string(architecture_hf_name(model.arch)) + " (created by tandem)"
                                                                         : deck.get<std::string>("model.path")});
  rows.push_back({"layers / hidden", std::to_string(model.layers) + " / " + std::to_string(model.hidden)});
  rows.push_back({"heads / kv heads / head dim",
                  std::to_string(model.heads) + " / " + std::to_string(model.kv_heads) + " / " + std::to_string(model.head_dim)});
  rows.push_back({"intermediate / vocab", std::to_string(model.intermediate) + " / " + std::to_string(model.vocab)});
  rows.push_back({"parameters", std::to_string(layout.parameter_count())});
  rows.push_back({"working dtype", dtype_name(working_dtype)});
  rows.push_back({"", ""});
  rows.push_back({"optimizer", deck.text("optimizer.name") + ", state on " + deck.text("optimizer.state")});
  rows.push_back({"master weights + optimizer state (FP32)",
                  format_bytes(3.0 * static_cast<double>(shard.elements()) * sizeof(float)) +
                      (shard.ranks() > 1 ? " on this rank, its ZeRO-1 shard of " + format_bytes(3.0 * layout.slab_bytes(DType::F32)) +
                                               " over " + std::to_string(shard.ranks()) + " ranks"
                                         : "")});
  rows.push_back({"checkpoint snapshot (rank 0, host)",
                  format_bytes(3.0 * layout.slab_bytes(DType::F32)) +
                      (deck.get<bool>("run.checkpoint-async") ? " held from the first checkpoint on" : " during each checkpoint")});
  rows.push_back({"gradients (FP32)", format_bytes(layout.slab_bytes(DType::F32))});
  const std::string kv_cache = format_bytes(static_cast<double>(kv_cache_bytes(deck, world.device()))) +
                               (deck.get<double>("rollout.kv-cache-fraction") > 0
                                    ? " (" + deck.text("rollout.kv-cache-fraction") + " of free memory)"
                                    : "") +
                               (deck.get<std::string>("rollout.kv-cache-dtype") == "fp8" ? ", FP8 E4M3 with scales" : "") +
                               (deck.get<std::string>("rollout.weight-dtype") == "fp8"
                                    ? "; + " + format_bytes(static_cast<double>(EngineForward::fp8_weight_bytes(model))) +
                                          " of FP8 projections beside it"
                                    : "");
  if (roles.split()) {
    // Each side on its own GPUs: no engine beside a trainer, nothing handed off.
    rows.push_back({"working copy", format_bytes(layout.slab_bytes(working_dtype))});
    rows.push_back({"each rollout rank: weights + KV cache",
                    format_bytes(layout.slab_bytes(working_dtype)) + " + " + kv_cache});
    rows.push_back({"weight sync", deck.text("sync.transport") + ", from the " + std::to_string(roles.trainers()) +
                                       " trainer ranks to the " + std::to_string(roles.engines()) + " rollout ranks"});
    return format_box("tandem setup", rows);
  }
  const bool alias = deck.get<std::string>("sync.transport") == "alias";
  rows.push_back({alias ? "working copy (the engine reads it)" : "working + engine copies",
                  format_bytes((alias ? 1.0 : 2.0) * layout.slab_bytes(working_dtype))});
  rows.push_back({"KV cache", kv_cache});
  rows.push_back({"offload", "train " + deck.text("memory.offload-train") + ", rollout " + deck.text("memory.offload-rollout") +
                                 " (" + deck.text("memory.offload-rollout-level") + "), peak on " +
                                 deck.text("memory.colocate-memory-peak-device")});
  return format_box("tandem setup", rows);
}

// Per-step metrics of the pool: current and peak bytes per tag, device and host.
void add_memory_metrics(MetricValues& metrics, const MemoryStats& stats) {
  metrics.push_back({"memory/device_peak", static_cast<double>(stats.device_peak)});
  metrics.push_back({"memory/host_peak", static_cast<double>(stats.host_peak)});
  // Since the job began; 0 when start-up filled the pinned host cache with every buffer.
  metrics.push_back({"memory/offload_host_allocations", static_cast<double>(stats.offload_host_allocations)});
  for (const auto& [tag, usage] : stats.per_tag) {
    metrics.push_back({"memory/" + tag + "/device_peak", static_cast<double>(usage.device_peak)});
    metrics.push_back({"memory/" + tag + "/host_peak", static_cast<double>(usage.host_peak)});
  }
}

std::string rng_state(const std::mt19937_64& rng) {
  std::ostringstream out;
  out << rng;
  return out.str();
}

// When this job must have stopped: run.max-time after `start`, else the Slurm job's end.
std::optional<std::time_t> stop_deadline_from_deck(const Deck& deck, std::time_t start) {
  const double max_time = deck.get<Seconds>("run.max-time").value;
  if (max_time > 0) return start + static_cast<std::time_t>(max_time);
  std::string note;
  const auto end = slurm_job_end_time(note);
  if (!note.empty()) TLOG(warning) << "run.max-time = 0 and the Slurm job's end time is unknown (" << note << "): no time limit";
  return end;
}

}  // namespace

static int run_job_logged(const Deck& deck, MPI_Comm comm);

// Every error that ends the job goes to tandem.log as well as to stderr (main prints it).
int run_job(const Deck& deck, MPI_Comm comm) {
  try {
    return run_job_logged(deck, comm);
  } catch (const std::exception& error) {
    log_fatal_to_file(error.what());
    throw;
  }
}

static int run_job_logged(const Deck& deck, MPI_Comm job_comm) {
  const std::time_t start_time = std::time(nullptr);
  auto world = World::create(job_comm, WorldOptions{deck.get<std::string>("world.device"),
                                                    static_cast<int>(deck.get<int64_t>("world.threads"))});
  init_logging({world->rank(), parse_log_level(deck.get<std::string>("world.log-level")), deck.get<bool>("world.log-all-ranks")});
  set_stall_timeout(job_comm, deck.get<Seconds>("world.stall-timeout").value);
  const bool root = world->rank() == 0;
  const fs::path folder = fs::path(deck.get<std::string>("run.output-dir")) / deck.get<std::string>("run.name");
  std::string error;
  if (root) {
    std::error_code failure;
    fs::create_directories(folder, failure);
    if (failure) error = "cannot create the run folder " + folder.string() + ": " + failure.message();
  }
  fail_together(job_comm, error, kExitBadInput);
  add_log_file(folder);

  const int64_t rollout_ranks = deck.get<int64_t>("world.rollout-ranks");
  if (rollout_ranks >= world->size())  // the same on every rank
    throw RanksFailedError(kExitBadInput, DeckError(deck.source("world.rollout-ranks"), "world.rollout-ranks",
                                                    "leaves no trainer among the job's " + std::to_string(world->size()) + " ranks")
                                              .what());
  Roles roles(*world, static_cast<int>(rollout_ranks));
  const MPI_Comm comm = roles.comm();  // the trainers' from here on (every rank's when colocated)
  const ModelConfig model = model_config_from_deck(deck);
  const ParameterLayout layout(model);
  const DType working_dtype = working_dtype_from_deck(deck, world->device());
  TLOG(info) << "tandem " << tandem_version() << " (" << tandem_git_revision() << "), resolved deck:\n" << deck.resolved_text();
  const SlabShards shard = optimizer_shard_from_deck(deck, layout, roles.size(), roles.rank());
  TLOG(info) << "\n" << startup_table(*world, roles, deck, model, layout, working_dtype, folder, shard);
  if (roles.role() == Role::Engine) return run_engine_rank(deck, *world, roles, model, layout, working_dtype);
  std::optional<RemoteRollout> rollout_ranks_client;
  if (roles.split()) rollout_ranks_client.emplace(roles);

  PoolOptions pool_options;
  pool_options.pinned_host_cache = deck.get<bool>("memory.pinned-host-cache");
  auto pool = MemoryPool::create(world->device(), std::max(world->gpu(), 0), pool_options);
  PhaseMemory startup_memory(*pool);
  startup_memory.begin();
  const HandoffConfig handoff_config = handoff_config_from_deck(deck);
  const ResumeChoice resume_choice = choose_resume(folder, deck.get<std::string>("run.restart"));
  // Buffers the first handoffs would give up start unmapped: start-up holds no more than a step.
  const std::vector<Tag> deferred = deferred_at_startup(handoff_config, resume_choice.starts_afresh());
  for (Tag tag : deferred) pool->set_deferred(tag, true);
  // The engine allocates its own KV cache from the pool (tag kv_cache).
  const OptimizerStateStore state_store =
      optimizer_state_store_from_deck(deck, shard, folder, world->device(), roles.rank(), comm);
  OptimizerStateFile* const state_file = state_store.file.get();
  ColocatedMemory memory(*pool, layout,
                         ColocatedMemorySettings{
                             .working_dtype = working_dtype,
                             .transport = transport_kind_from_name(deck.get<std::string>("sync.transport")),
                             .optimizer_state = state_store.data(),
                             .state_slot_bytes = optimizer_state_slot_bytes(optimizer_settings_from_deck(deck), layout),
                             .disk_delta = disk_delta_settings_from_deck(deck, layout, *world, roles),
                             .broadcast = broadcast_settings_from_deck(deck, roles),
                             .shard = shard});
  auto sync_weights = [&] {
    if (!rollout_ranks_client) return memory.sync_weights();
    return rollout_ranks_client->join(EngineOrder::Sync, [&] { return memory.sync_weights(); });
  };
  HandoffExecutor handoff(*pool, handoff_config, sync_weights,
                          [&](const std::vector<std::string>& names) { memory.rebuild(names); });
  TrainerCheckpoint trainer_checkpoint(memory, optimizer_settings_from_deck(deck).kind, comm);
  GrpoStep grpo(deck, model, layout, memory, *pool, roles.communicator(), roles.rank(), roles.size(), comm,
                rollout_ranks_client ? &*rollout_ranks_client : nullptr);
  for (Tag tag : deferred) pool->set_deferred(tag, false);
  // Every buffer is laid out, and neither the weights nor a pinned host buffer are in host
  // memory yet: predict, and refuse a plan the host cannot hold.
  MemoryBaseline baseline = measure_baseline(*pool);
  baseline.startup_staging = layout.slab_bytes(DType::F32);
  if (root && deck.get<bool>("run.checkpoint-async")) baseline.checkpoint_snapshot = 3 * layout.slab_bytes(DType::F32);
  const MemoryPlan plan(pool->allocations(), handoff_config, pool->device(), pool_options.pinned_host_cache, baseline);
  TLOG(info) << "\n" << plan.table();
  check_host_limit(plan, deck.get<Bytes>("memory.host-limit").value, deck.source("memory.host-limit"), comm);
  // The handoffs' pinned host buffers are allocated on the pool's thread beside what
  // start-up does from here on (a restart's checkpoint read, the initial weights' draw),
  // not by the start-up handoff: as many as fit beside the staged weights now, the rest
  // once they are on the device.
  const HostCacheFill& host_cache_fill = plan.host_cache_fill();
  if (!host_cache_fill.beside_staging.empty()) pool->fill_host_cache(host_cache_fill.beside_staging);

  // Restart: the newest checkpoint of this run that loads and verifies, a named one, or none.
  const uint64_t seed = static_cast<uint64_t>(deck.get<int64_t>("run.seed"));
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(roles.rank()));
  int64_t step = 0, data_cursor = 0;
  std::string resumed_deck;
  std::vector<std::string> resume_notes;
  CheckpointLoader loader;
  loader.check_fits = [&](const Checkpoint& checkpoint) {
    if (static_cast<int>(checkpoint.rng_states().size()) != roles.size())
      throw RanksFailedError(kExitBadInput, checkpoint.path().string() + " was written by " +
                                                std::to_string(checkpoint.rng_states().size()) + " trainer ranks, this job has " +
                                                std::to_string(roles.size()));
  };
  loader.load = [&](const Checkpoint& checkpoint) {
    trainer_checkpoint.read(checkpoint);
    std::istringstream(checkpoint.rng_states()[roles.rank()]) >> rng;
    step = checkpoint.step();
    data_cursor = checkpoint.data_cursor();
    resumed_deck = checkpoint.deck_text();
  };
  const std::optional<fs::path> resume_from = resume_checkpoint(resume_choice, loader, comm, resume_notes);
  std::vector<std::string> changed_keys;
  if (resume_from) {
    TLOG(info) << "resumed from " << resume_from->string() << " at step " << step;
    changed_keys = changed_deck_keys(resumed_deck, deck.resolved_text());
    if (root)
      for (const std::string& change : changed_keys) TLOG(warning) << "the deck changed since the checkpoint: " << change;
  }
  if (!resume_from || grpo.has_reference()) {
    // The initial policy, read or drawn once: a fresh start's weights (model.path's, or a
    // random model from the seed) and the KL term's frozen reference.
    const std::vector<float> initial = initial_weights_from_deck(deck, layout);
    if (!resume_from) memory.load_weights(initial);
    grpo.load_reference(initial);
  }
  if (!host_cache_fill.after_staging.empty()) pool->fill_host_cache(host_cache_fill.after_staging);

  std::optional<RunFile> run_file;
  if (root) {
    const fs::path path = folder / kRunFileName;
    const size_t notes_before = resume_notes.size();
    if (resume_from) run_file = resume_run_file(folder, *resume_from, step, resume_notes);
    for (size_t i = notes_before; i < resume_notes.size(); ++i) TLOG(warning) << resume_notes[i];
    if (!run_file) {
      if (fs::exists(path)) fs::remove(path);  // a fresh start replaces the old run's record
      std::vector<std::string> devices;
      for (const RankPlacement& p : world->placements()) devices.push_back(p.device + " @ " + p.host);
      run_file = RunFile::create(path, RunInfo{deck.resolved_text(), tandem_version(), tandem_git_revision(), world->size(), devices, now_iso8601()});
    }
    run_file->append_job(JobRecord{now_iso8601(), deck.resolved_text(), resume_from ? resume_from->string() : "", step,
                                   changed_keys, resume_notes});
  }

  const int64_t steps = deck.get<int64_t>("run.steps");
  const int64_t checkpoint_every = deck.get<int64_t>("run.checkpoint-every");
  const int64_t samples_every = deck.get<int64_t>("run.samples-every");
  const int64_t report_every = deck.get<int64_t>("run.report-every");
  ReportSettings report;
  report.sample_steps = deck.get<int64_t>("run.report-sample-steps");
  // A long run chained over several batch jobs: this job stops after steps-per-job steps
  // with a checkpoint, and the next one (restart = auto) continues from it.
  const int64_t steps_per_job = deck.get<int64_t>("run.steps-per-job");
  const int64_t last_step = steps_per_job > 0 ? std::min(steps, step + steps_per_job) : steps;
  const int keep = static_cast<int>(deck.get<int64_t>("run.keep-checkpoints"));
  CheckpointWriter checkpoint_writer({folder, keep, deck.get<bool>("run.checkpoint-async"), root, state_file},
                                     trainer_checkpoint, world->device());
  const OnNonFinite on_non_finite = on_non_finite_from_name(deck.get<std::string>("train.on-nonfinite"));
  EntropyWatch entropy_watch(model.vocab);
  int64_t skipped_steps = 0;
  PhaseTimers timers;
  const auto loop_start = std::chrono::steady_clock::now();
  if (rollout_ranks_client) rollout_ranks_client->check_engines_started();  // the engines' first order
  // rollout.max-staleness = 1: the rollout ranks sample the next step's first round while
  // the trainers train this one, with the weights they hold (the previous step's). A job's
  // first round is always sampled afresh: nothing is ordered ahead of a job's end, of a
  // scheduled checkpoint (so a restart from it takes the same steps) nor of a stop.
  const bool overlap = deck.get<int64_t>("rollout.max-staleness") > 0;
  const int64_t prompts_per_step = deck.get<int64_t>("task.prompts-per-step");
  auto checkpoint_scheduled = [&](int64_t at) {
    return (checkpoint_every > 0 && (at % checkpoint_every == 0 || at == steps)) || (at == last_step && at < steps);
  };
  if (overlap && resume_from && root)
    TLOG(info) << "rollout.max-staleness = 1: step " << step + 1
               << "'s first round is sampled afresh, with the checkpoint's weights (policy age 0)";
  {
    ScopedPhase phase(timers, "handoff");
    handoff.run(HandoffPoint::Startup);
    handoff.run(HandoffPoint::BeforeSync);  // the engine's first weights come from the trainer
  }
  if (rollout_ranks_client) rollout_ranks_client->announce(EngineOrder::StartStopPoint);
  StopPoint stop_point(job_comm, root ? stop_deadline_from_deck(deck, start_time) : std::nullopt);
  // Start-up ends once the host cache is filled: the plan counts its buffers there. The
  // last ones were allocated beside the start-up handoff, so little is left to wait for.
  pool->wait_for_host_cache_fill();
  std::optional<PhasePeak> startup_peak = startup_memory.end();  // recorded with the job's first step
  // The first checkpoint's pinned snapshot is allocated beside the first rollout, not at
  // the checkpoint (the memory plan counts it in every step's phases).
  if (checkpoint_every > 0 || last_step < steps) checkpoint_writer.prepare_snapshot();
  std::map<std::string, PhasePeak> measured{{"startup", *startup_peak}};  // the largest of each phase
  size_t derived_not_copied = 0;  // by one offload of the trainer
  PhaseMemory phase_memory(*pool);
  std::string last_checkpoint;
  bool stopping = false;
  std::string stop_reason;
  // Trainer rank 0 cuts a rollout on the rollout ranks for a stop signal or the time limit.
  if (rollout_ranks_client) rollout_ranks_client->cut_rounds_when([&] { return stop_point.cut_reason(); });
  int64_t checkpointed_step = step;  // the newest step whose state a checkpoint holds (a fresh start needs none)
  // Collective: a checkpoint of the state after `step` (the trainer's state is on the
  // device between train and the next handoff).
  auto snapshot_checkpoint = [&] {
    ScopedPhase phase(timers, "checkpoint");
    const auto checkpoint_start = std::chrono::steady_clock::now();
    const auto states = all_gather_strings(comm, rng_state(rng), "the gathering of the ranks' generator states for a checkpoint");
    checkpoint_writer.snapshot(step, data_cursor, deck.resolved_text(), states);  // collective: the shards onto rank 0
    checkpointed_step = step;
    // A stop must leave time for the writer to finish as well.
    stop_point.note_checkpoint_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - checkpoint_start).count() +
                                       checkpoint_writer.longest_background_seconds());
  };
  while (step < last_step && !stopping) {
    ++step;
    set_log_step(step);
    const auto step_start = std::chrono::steady_clock::now();
    MetricValues metrics;
    pool->reset_peaks();
    RolloutSummary rollout;
    double rollout_seconds = 0, train_seconds = 0;
    PhasePeak rollout_peak, train_peak;
    {
      ScopedPhase phase(timers, "rollout");
      phase_memory.begin();
      const auto start = std::chrono::steady_clock::now();
      const bool sampled_ahead = rollout_ranks_client && rollout_ranks_client->prefetched();
      rollout = grpo.rollout(step, data_cursor, sampled_ahead ? 1 : 0);
      rollout_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      rollout_peak = phase_memory.end();
    }
    if (!rollout.stopped.empty()) {
      // A stop cut the rollout on the rollout ranks: the step is void, and the job stops with
      // the state before it, which a restart takes up by redoing the same rollout.
      --step;
      stopping = true;
      stop_reason = rollout.stopped + " during the rollout of step " + std::to_string(step + 1);
      handoff.run(HandoffPoint::AfterGenerate);
      if (step > checkpointed_step) {
        snapshot_checkpoint();
        if (root) checkpoint_writer.publish();
      }
      break;
    }
    // The next round's first prompt follows the ones this step drew (dynamic sampling's
    // extra rounds included), as every trainer asks for it at the next step.
    if (overlap && step < last_step && !checkpoint_scheduled(step))
      rollout_ranks_client->prefetch(step + 1, static_cast<uint64_t>(data_cursor + rollout.prompts_drawn), prompts_per_step);
    HandoffReport to_train, to_rollout;
    {
      ScopedPhase phase(timers, "handoff");
      to_train = handoff.run(HandoffPoint::AfterGenerate);
    }
    TrainStepResult trained;
    {
      ScopedPhase phase(timers, "train");
      phase_memory.begin();
      const auto start = std::chrono::steady_clock::now();
      trained = grpo.train(step, rollout);
      train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      train_peak = phase_memory.end();
    }
    data_cursor += rollout.prompts_drawn;  // over all ranks: a restart draws the next prompts
    // Every rank sees the same norm (after the all-reduce), so all take this branch together.
    const bool non_finite = !std::isfinite(trained.grad_norm);
    const std::string non_finite_text = non_finite ? non_finite_report(comm, step, trained.grad_norm, trained.non_finite) : "";
    const bool stop_here = non_finite && on_non_finite == OnNonFinite::Stop;
    {
      // Where the ranks wait for the slowest: under rollout.max-staleness = 1 the trainers wait
      // here for the engines' round of the next step.
      ScopedPhase phase(timers, "step_boundary");
      if (rollout_ranks_client) rollout_ranks_client->announce(EngineOrder::StepBoundary);
      stopping = stop_point.agree() && step < last_step;  // a signal or the time limit: this step is the last
    }
    if (stopping) stop_reason = stop_point.reason();
    if (stopping && rollout_ranks_client && rollout_ranks_client->prefetched()) {
      rollout_ranks_client->discard();
      if (root) TLOG(info) << "the stop drops the round the rollout ranks sampled ahead for step " << step + 1;
    }
    // Committed after the step's metrics row (see run_file_copy.h); root only.
    bool checkpoint_pending = false;
    if (checkpoint_scheduled(step) || stop_here || stopping) {
      snapshot_checkpoint();
      checkpoint_pending = root;
    }
    {
      ScopedPhase phase(timers, "handoff");
      to_rollout = handoff.run(HandoffPoint::BeforeSync);
    }
    const MemoryStats stats = pool->stats();
    double reward_mean = 0, reward_std = 0, accuracy = 0, format_rate = 0, response_length = 0;
    {
      // The rollout's statistics over every rank's counted samples (sums), the loss's over
      // the ranks (each trains as many sequences): means, a sum, a max.
      double sums[] = {rollout.reward_sum, rollout.reward_square_sum, rollout.correct_sum, rollout.format_sum,
                       static_cast<double>(rollout.generated_tokens), static_cast<double>(rollout.drawn_samples),
                       trained.metrics.clip_fraction_low, trained.metrics.clip_fraction_high, trained.metrics.ratio_mean,
                       trained.metrics.kl_mean, trained.metrics.entropy_mean};
      all_reduce(MPI_IN_PLACE, sums, std::size(sums), MPI_DOUBLE, MPI_SUM, comm, "the reduction of metrics");
      const double samples = sums[5], ranks = roles.size();
      reward_mean = sums[0] / samples;
      const double variance = std::max(0.0, sums[1] / samples - reward_mean * reward_mean);
      reward_std = samples > 1 ? std::sqrt(variance * samples / (samples - 1)) : 0.0;
      accuracy = sums[2] / samples;
      format_rate = sums[3] / samples;
      response_length = sums[4] / samples;
      rollout.generated_tokens = static_cast<int64_t>(sums[4]);
      trained.metrics.clip_fraction_low = sums[6] / ranks;
      trained.metrics.clip_fraction_high = sums[7] / ranks;
      trained.metrics.ratio_mean = sums[8] / ranks;
      trained.metrics.kl_mean = sums[9] / ranks;
      trained.metrics.entropy_mean = sums[10] / ranks;
      all_reduce(MPI_IN_PLACE, &trained.metrics.ratio_max, 1, MPI_DOUBLE, MPI_MAX, comm, "the reduction of metrics");
    }
    const double moved = static_cast<double>(to_train.bytes_moved + to_rollout.bytes_moved);
    const double handoff_seconds = to_train.seconds + to_rollout.seconds;
    const bool sft = grpo.is_sft(step);
    metrics.push_back({"phase_sft", sft ? 1.0 : 0.0});
    metrics.push_back({"reward_mean", reward_mean});
    metrics.push_back({"reward_std", reward_std});
    metrics.push_back({"accuracy", accuracy});
    metrics.push_back({"format_rate", format_rate});
    metrics.push_back({"response_length", response_length});
    metrics.push_back({"loss", trained.loss});
    metrics.push_back({"grad_norm", trained.grad_norm});
    metrics.push_back({"clip_fraction_low", trained.metrics.clip_fraction_low});
    metrics.push_back({"clip_fraction_high", trained.metrics.clip_fraction_high});
    metrics.push_back({"ratio_mean", trained.metrics.ratio_mean});
    metrics.push_back({"ratio_max", trained.metrics.ratio_max});
    metrics.push_back({"kl", trained.metrics.kl_mean});
    metrics.push_back({"entropy", trained.metrics.entropy_mean});
    metrics.push_back({"rollout_tokens_per_s", rollout_seconds > 0 ? rollout.generated_tokens / rollout_seconds : 0.0});
    metrics.push_back({"train_tokens_per_s", train_seconds > 0 ? trained.tokens / train_seconds : 0.0});
    metrics.push_back({"handoff/bytes", moved});
    metrics.push_back({"handoff/seconds", handoff_seconds});
    metrics.push_back({"handoff/derived_not_copied", static_cast<double>(to_train.derived_not_copied + to_rollout.derived_not_copied)});
    metrics.push_back({"sync/bytes", static_cast<double>(to_rollout.sync.bytes)});
    metrics.push_back({"sync/seconds", to_rollout.sync.seconds});
    metrics.push_back({"sync/wire_bytes", static_cast<double>(to_rollout.sync.wire_bytes)});
    metrics.push_back({"sync/density", to_rollout.sync.density});
    metrics.push_back({"sync/source_seconds", to_rollout.sync.source_seconds});
    metrics.push_back({"sync/engine_seconds", to_rollout.sync.engine_seconds});
    if (startup_peak) add_phase_metrics(metrics, "startup", *std::exchange(startup_peak, std::nullopt));
    add_phase_metrics(metrics, "rollout", rollout_peak);
    add_phase_metrics(metrics, "after_generate", to_train.peak);
    add_phase_metrics(metrics, "train", train_peak);
    add_phase_metrics(metrics, "before_sync", to_rollout.peak);
    for (const auto& [phase, peak] : {std::pair<const char*, const PhasePeak&>{"rollout", rollout_peak}, {"after_generate", to_train.peak},
                                      {"train", train_peak}, {"before_sync", to_rollout.peak}})
      measured[phase] = largest(measured[phase], peak);
    derived_not_copied = std::max(derived_not_copied, to_rollout.derived_not_copied);
    metrics.push_back({"data_cursor", static_cast<double>(data_cursor)});
    metrics.push_back({"rollout/staleness", rollout.staleness});
    metrics.push_back({"skipped", non_finite ? 1.0 : 0.0});
    metrics.insert(metrics.end(), rollout.sampling_metrics.begin(), rollout.sampling_metrics.end());
    add_memory_metrics(metrics, stats);
    const ResidentMemory resident = resident_memory();  // rank 0's
    metrics.push_back({"memory/rss_anon", static_cast<double>(resident.anonymous)});
    metrics.push_back({"memory/rss_file", static_cast<double>(resident.file_backed)});
    // At the step they are known: the checkpoint's own (synchronous) or an earlier one's
    // that has ended since (background).
    if (const auto finished = checkpoint_writer.take_finished()) {
      if (root) metrics.push_back({"checkpoint/write_seconds", finished->write_seconds});
      if (finished->state_msync_seconds)
        metrics.push_back({"checkpoint/state_msync_seconds", *finished->state_msync_seconds});
    }
    metrics.push_back({"time/optimizer_step", trained.optimizer_seconds});
    if (trained.state_bytes_streamed)
      metrics.push_back({"optimizer/state_stream_gb_per_s", trained.state_bytes_streamed / trained.optimizer_seconds / 1e9});
    for (const auto& [phase, seconds] : timers.take_step_times()) metrics.push_back({"time/" + phase, seconds});
    metrics.push_back({"time/step", std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count()});
    if (root) {
      run_file->append_metrics(step, metrics);
      if (samples_every > 0 && step % samples_every == 0) run_file->append_samples(step, grpo.samples(rollout, trained));
      if (checkpoint_pending) {
        ScopedPhase phase(timers, "checkpoint");
        checkpoint_writer.publish();
      }
      if (report_every > 0 && step % report_every == 0 && step < last_step) write_report(folder, report);
    }
    TLOG(info) << (sft ? "sft " : "rl  ") << step << "/" << steps << " | reward " << format_fixed(reward_mean, 3)
               << " acc " << format_fixed(accuracy, 3) << " len " << format_fixed(response_length, 1)
               << " | loss " << format_fixed(trained.loss, 4) << " grad " << format_fixed(trained.grad_norm, 3)
               << " clip " << format_fixed(trained.metrics.clip_fraction_low + trained.metrics.clip_fraction_high, 3)
               << " | " << format_fixed(rollout_seconds > 0 ? rollout.generated_tokens / rollout_seconds : 0.0, 0)
               << " rollout tok/s | handoff " << format_bytes(moved) << " | peak device " << format_bytes(stats.device_peak)
               << " host " << format_bytes(stats.host_peak) << " | e.g. " << rollout.example;
    // The entropy and the report are the same on every rank: rank 0 says them.
    if (!sft)
      if (const auto collapse = entropy_watch.observe(trained.metrics.entropy_mean); collapse && root)
        TLOG(warning) << *collapse;
    if (stop_here) {
      checkpoint_writer.wait();
      throw RanksFailedError(kExitNumericalFailure,  // every rank saw the same norm
                             non_finite_text + "; the update was skipped and checkpoint " + checkpoint_file_name(step) +
                                 " holds the weights before it (train.on-nonfinite = skip would step over it)");
    }
    if (non_finite && root)
      TLOG(warning) << non_finite_text << "; update skipped (" << ++skipped_steps << " skipped in this job)";
  }
  set_log_step(-1);
  if (checkpoint_writer.in_flight()) {  // rank 0's write, every rank's msync
    ScopedPhase phase(timers, "checkpoint");
    checkpoint_writer.wait();
  }
  if (root) last_checkpoint = checkpoint_writer.last_committed();
  if (rollout_ranks_client) rollout_ranks_client->finish();
  if (root) write_report(folder, report);
  const double loop_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
  const std::string table = timers.summary_table(comm, loop_seconds);
  // jobs/tandem.sbatch reads these lines in tandem.log: "stopped" means submit the next job.
  if (step < steps)
    TLOG(info) << "stopped at step " << step << " of " << steps << ": "
               << (stopping ? stop_reason : "run.steps-per-job = " + std::to_string(steps_per_job))
               << "; a job with run.restart = auto resumes from " << last_checkpoint;
  TLOG(info) << (step < steps ? "job complete\n" : "run complete\n") << table << plan.comparison(measured, derived_not_copied)
             << "outputs:\n  log         " << (folder / "tandem.log").string()
             << "\n  run file    " << (folder / kRunFileName).string()
             << "\n  report      " << (folder / kReportFileName).string()
             << (last_checkpoint.empty() ? std::string() : "\n  checkpoint  " + last_checkpoint);
  return 0;
}

}  // namespace tandem
