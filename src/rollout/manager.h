// Several engine instances (one per rank, or several per rank) behind one manager that
// hands out prompt groups, collects completions and can abort. Each instance runs on its
// own thread; an abort reaches every instance and returns only once each has dropped its
// work and freed all its KV blocks.
//
// A prompt with G samples is a group; all samples of a group run on one instance (groups
// go round-robin). Request ids are numbered by the manager in submission order over its
// whole life, and each sample's random stream is seeded from (seed, request id), so the
// tokens do not depend on how many instances there are.
//
// Stopping early: over-sampling (enough complete groups), a time limit, an abort() from
// another thread, or shutdown. Samples still running then come back as
// FinishReason::Abort with the tokens they had, never as finished.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "deck/units.h"
#include "rollout/engine.h"
#include "rollout/request.h"

namespace tandem {

struct RolloutPrompt {
  std::vector<int32_t> prompt;
  int samples = 1;  // the group size
  SamplingParams sampling;
};

struct RolloutGroup {
  size_t index = 0;                 // position in the prompts given to generate()
  int instance = 0;                 // the engine instance that ran it
  std::vector<Completion> samples;  // in sample order
  // Every sample finished by a stop or by length.
  bool complete() const;
};

struct RolloutLimits {
  size_t groups_needed = 0;  // stop once this many groups are complete; 0: run every group
  Seconds time_limit{0};     // stop after this long; 0: no limit
};

struct RolloutResult {
  std::vector<RolloutGroup> completed;  // in the order they completed (more than needed if
                                        // several completed in the same instant)
  std::vector<RolloutGroup> aborted;    // the others, in prompt order; their finished
                                        // samples keep their own finish reason
  std::string abort_reason;             // why the rest was aborted; empty if nothing was
  double seconds = 0;
};

struct InstanceStatus {
  size_t running = 0, waiting = 0;
  int32_t free_blocks = 0, total_blocks = 0;
  EngineStats stats;
};

class RolloutManager {
 public:
  // Starts one thread per engine. Throws std::invalid_argument for an empty list.
  explicit RolloutManager(std::vector<std::unique_ptr<Engine>> engines);
  ~RolloutManager();  // shutdown()
  RolloutManager(const RolloutManager&) = delete;
  RolloutManager& operator=(const RolloutManager&) = delete;

  // Runs the groups and returns when all are done or the limits (or an abort) stop it.
  // Requests are checked before any is handed out (std::invalid_argument). An error in an
  // instance aborts everything and is rethrown here as std::runtime_error naming it.
  // One generate() at a time.
  RolloutResult generate(const std::vector<RolloutPrompt>& prompts, const RolloutLimits& limits = {});

  // Ends the generate() in progress early, from any thread; without one, does nothing.
  void abort(const std::string& reason);
  // Aborts, stops the threads and joins them. generate() refuses afterwards.
  void shutdown();

  size_t instances() const { return workers_.size(); }
  // A snapshot of each instance, taken after its latest step or abort.
  std::vector<InstanceStatus> status() const;

 private:
  struct Worker {
    std::unique_ptr<Engine> engine;
    std::thread thread;
    mutable std::mutex mutex;
    std::condition_variable wake;
    std::vector<GenerationRequest> inbox;
    uint64_t aborts_requested = 0, aborts_done = 0;
    bool stop = false;
    InstanceStatus status;
  };

  void run_worker(Worker& worker, int instance);
  void post(int instance, std::vector<Completion> completions);
  // Every instance drops its queue and running sequences; returns when all have.
  void abort_instances();

  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t next_request_id_ = 0;

  // Completions on their way from the workers to generate().
  std::mutex results_mutex_;
  std::condition_variable results_ready_;
  std::vector<std::pair<int, Completion>> results_;
  std::string failure_;       // the first instance error
  std::string abort_reason_;  // set by abort()
  bool generating_ = false, shut_down_ = false;
  std::condition_variable generate_ended_;
};

}  // namespace tandem
