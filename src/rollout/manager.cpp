#include "rollout/manager.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

InstanceStatus snapshot(const Engine& engine) {
  return {engine.running(), engine.waiting(), engine.free_blocks(), engine.total_blocks(), engine.stats()};
}

}  // namespace

bool RolloutGroup::complete() const {
  return !samples.empty() && std::all_of(samples.begin(), samples.end(),
                                         [](const Completion& c) { return c.finish != FinishReason::Abort; });
}

RolloutManager::RolloutManager(std::vector<std::unique_ptr<Engine>> engines) {
  if (engines.empty()) throw std::invalid_argument("RolloutManager: needs at least one engine instance");
  for (auto& engine : engines) {
    if (!engine) throw std::invalid_argument("RolloutManager: an engine instance is null");
    auto worker = std::make_unique<Worker>();
    worker->status = snapshot(*engine);
    worker->engine = std::move(engine);
    workers_.push_back(std::move(worker));
  }
  for (size_t i = 0; i < workers_.size(); ++i)
    workers_[i]->thread = std::thread([this, i] { run_worker(*workers_[i], static_cast<int>(i)); });
}

RolloutManager::~RolloutManager() { shutdown(); }

void RolloutManager::post(int instance, std::vector<Completion> completions) {
  if (completions.empty()) return;
  {
    std::lock_guard lock(results_mutex_);
    for (Completion& completion : completions) results_.emplace_back(instance, std::move(completion));
  }
  results_ready_.notify_all();
}

void RolloutManager::run_worker(Worker& worker, int instance) {
  Engine& engine = *worker.engine;
  uint64_t aborts_done = 0;
  for (;;) {
    std::vector<GenerationRequest> incoming;
    uint64_t aborts_requested = 0;
    bool stop = false;
    {
      std::unique_lock lock(worker.mutex);
      worker.wake.wait(lock, [&] {
        return worker.stop || worker.aborts_requested != aborts_done || !worker.inbox.empty() || engine.has_work();
      });
      incoming.swap(worker.inbox);
      aborts_requested = worker.aborts_requested;
      stop = worker.stop;
    }
    const bool abort_now = stop || aborts_requested != aborts_done;
    std::vector<Completion> completions;
    std::string error;
    try {
      for (GenerationRequest& request : incoming) engine.submit(std::move(request));
      if (abort_now)
        completions = engine.abort();
      else if (engine.has_work())
        completions = engine.step();
    } catch (const std::exception& e) {
      error = "rollout instance " + std::to_string(instance) + ": " + e.what();
      completions = engine.abort();
    }
    if (!error.empty()) {
      std::lock_guard lock(results_mutex_);
      if (failure_.empty()) failure_ = error;
    }
    // The status first, so whoever receives these completions sees the engine after them;
    // the completions before the abort is acknowledged, so an acknowledged abort has
    // nothing in flight.
    {
      std::lock_guard lock(worker.mutex);
      worker.status = snapshot(engine);
    }
    post(instance, std::move(completions));
    if (!error.empty()) results_ready_.notify_all();
    {
      std::lock_guard lock(worker.mutex);
      aborts_done = aborts_requested;
      worker.aborts_done = aborts_done;
    }
    worker.wake.notify_all();
    if (stop) return;
  }
}

void RolloutManager::abort_instances() {
  std::vector<uint64_t> tickets(workers_.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& worker = *workers_[i];
    std::vector<Completion> never_started;
    {
      std::lock_guard lock(worker.mutex);
      for (const GenerationRequest& request : worker.inbox) {
        Completion dropped;
        dropped.request_id = request.id;
        never_started.push_back(std::move(dropped));  // FinishReason::Abort, no tokens
      }
      worker.inbox.clear();
      tickets[i] = ++worker.aborts_requested;
    }
    worker.wake.notify_all();
    post(static_cast<int>(i), std::move(never_started));
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& worker = *workers_[i];
    std::unique_lock lock(worker.mutex);
    worker.wake.wait(lock, [&] { return worker.aborts_done >= tickets[i]; });
  }
}

RolloutResult RolloutManager::generate(const std::vector<RolloutPrompt>& prompts, const RolloutLimits& limits) {
  {
    std::lock_guard lock(results_mutex_);
    if (shut_down_) throw std::logic_error("RolloutManager::generate after shutdown");
    if (generating_) throw std::logic_error("RolloutManager::generate is already running");
    generating_ = true;
    results_.clear();
    failure_.clear();
    abort_reason_.clear();
  }
  struct EndOfGenerate {
    RolloutManager& manager;
    ~EndOfGenerate() {
      {
        std::lock_guard lock(manager.results_mutex_);
        manager.generating_ = false;
      }
      manager.generate_ended_.notify_all();
    }
  } end_of_generate{*this};
  const Clock::time_point start = Clock::now();

  // Every request is checked before any is handed out.
  const size_t N = workers_.size();
  std::vector<RolloutGroup> groups(prompts.size());
  std::vector<std::vector<GenerationRequest>> batches(N);
  std::vector<std::pair<size_t, size_t>> owner;  // request id - first id -> (group, sample)
  const uint64_t first_id = next_request_id_;
  for (size_t g = 0; g < prompts.size(); ++g) {
    if (prompts[g].samples < 1)
      throw std::invalid_argument("RolloutManager: prompt " + std::to_string(g) + " asks for " +
                                  std::to_string(prompts[g].samples) + " samples");
    groups[g].index = g;
    groups[g].instance = static_cast<int>(g % N);
    groups[g].samples.resize(prompts[g].samples);
    for (int s = 0; s < prompts[g].samples; ++s) {
      GenerationRequest request{first_id + owner.size(), prompts[g].prompt, prompts[g].sampling};
      workers_[g % N]->engine->check(request);
      owner.emplace_back(g, s);
      batches[g % N].push_back(std::move(request));
    }
  }
  next_request_id_ += owner.size();
  for (size_t i = 0; i < N; ++i) {
    if (batches[i].empty()) continue;
    {
      std::lock_guard lock(workers_[i]->mutex);
      for (GenerationRequest& request : batches[i]) workers_[i]->inbox.push_back(std::move(request));
    }
    workers_[i]->wake.notify_all();
  }

  std::vector<size_t> received(groups.size(), 0);
  std::vector<size_t> completion_order;
  size_t groups_done = 0;
  auto absorb = [&](std::vector<std::pair<int, Completion>>& arrived) {
    for (auto& [instance, completion] : arrived) {
      const auto [g, s] = owner.at(completion.request_id - first_id);
      groups[g].samples[s] = std::move(completion);
      if (++received[g] < groups[g].samples.size()) continue;
      ++groups_done;
      if (groups[g].complete()) completion_order.push_back(g);
    }
    arrived.clear();
  };

  const bool timed = limits.time_limit.value > 0;
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.time_limit.value));
  std::string abort_reason, failure;
  std::vector<std::pair<int, Completion>> arrived;
  while (groups_done < groups.size()) {
    std::string external;
    {
      std::unique_lock lock(results_mutex_);
      auto ready = [&] { return !results_.empty() || !failure_.empty() || !abort_reason_.empty(); };
      if (timed)
        results_ready_.wait_until(lock, deadline, ready);
      else
        results_ready_.wait(lock, ready);
      arrived.swap(results_);
      failure = failure_;
      external = abort_reason_;
    }
    absorb(arrived);
    if (groups_done == groups.size()) break;
    if (!failure.empty())
      abort_reason = "error: " + failure;
    else if (limits.groups_needed > 0 && completion_order.size() >= limits.groups_needed)
      abort_reason = "over-sampling: " + std::to_string(completion_order.size()) + " of " +
                     std::to_string(groups.size()) + " groups complete";
    else if (timed && Clock::now() >= deadline)
      abort_reason = "time limit of " + format_seconds(limits.time_limit) + " reached";
    else if (!external.empty())
      abort_reason = external;
    if (abort_reason.empty()) continue;
    abort_instances();
    {
      std::lock_guard lock(results_mutex_);
      arrived.swap(results_);
    }
    absorb(arrived);
    if (groups_done != groups.size()) throw std::logic_error("RolloutManager: an abort left samples unaccounted for");
    break;
  }
  if (!failure.empty()) throw std::runtime_error(failure);

  RolloutResult result;
  result.abort_reason = abort_reason;
  for (size_t g : completion_order) result.completed.push_back(std::move(groups[g]));
  for (RolloutGroup& group : groups)
    if (!group.samples.empty() && !group.complete()) result.aborted.push_back(std::move(group));
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

void RolloutManager::abort(const std::string& reason) {
  {
    std::lock_guard lock(results_mutex_);
    if (!generating_ || !abort_reason_.empty()) return;
    abort_reason_ = reason.empty() ? "aborted" : reason;
  }
  results_ready_.notify_all();
}

void RolloutManager::shutdown() {
  {
    std::unique_lock lock(results_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    if (generating_ && abort_reason_.empty()) abort_reason_ = "shutdown";
    results_ready_.notify_all();
    generate_ended_.wait(lock, [&] { return !generating_; });
  }
  for (auto& worker : workers_) {
    {
      std::lock_guard lock(worker->mutex);
      worker->stop = true;
    }
    worker->wake.notify_all();
  }
  for (auto& worker : workers_) worker->thread.join();
}

std::vector<InstanceStatus> RolloutManager::status() const {
  std::vector<InstanceStatus> all;
  for (const auto& worker : workers_) {
    std::lock_guard lock(worker->mutex);
    all.push_back(worker->status);
  }
  return all;
}

}  // namespace tandem
