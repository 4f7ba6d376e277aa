#include "driver/remote_rollout.h"

#include <algorithm>

#include "world/log.h"
#include "world/stall_guard.h"
#include "world/world.h"

namespace tandem {

namespace {

// Collective over comm: `bytes` of rank `root`, on every rank.
void broadcast_string(MPI_Comm comm, std::string& bytes, int root, const char* what) {
  uint64_t size = bytes.size();
  MPI_Request request;
  MPI_Ibcast(&size, 1, MPI_UINT64_T, root, comm, &request);
  wait_for_ranks(request, what, comm);
  bytes.resize(size);
  constexpr uint64_t kSlice = uint64_t{1} << 30;  // MPI counts are int
  for (uint64_t offset = 0; offset < size; offset += kSlice) {
    MPI_Ibcast(bytes.data() + offset, static_cast<int>(std::min(kSlice, size - offset)), MPI_CHAR, root, comm, &request);
    wait_for_ranks(request, what, comm);
  }
}

}  // namespace

RemoteRollout::RemoteRollout(Roles& roles) : roles_(roles) {}

RemoteRollout::~RemoteRollout() {
  if (engines_left_ || roles_.link() == MPI_COMM_NULL) return;
  try {
    broadcast_command(roles_.link(), {EngineOrder::TrainersFailed});
  } catch (const std::exception& e) {
    TLOG(error) << "could not tell the rollout ranks that the trainers failed: " << e.what();
  }
}

void RemoteRollout::check_engines_started() {
  std::string reply = groups_reply({});
  if (roles_.link() != MPI_COMM_NULL) {
    tell({EngineOrder::ReportStartUp});
    try {
      fail_together_on_link(roles_.link(), "");
    } catch (const RanksFailedError& error) {
      engines_left_ = true;  // they fail with this error too
      reply = error_reply(error.code(), error.what());
    }
  }
  hand_on(reply, 0, 0);
}

RoundGroups RemoteRollout::sample(int64_t step, uint64_t first, int64_t count, const BatchDecision& decision) {
  const int rank = roles_.rank();
  const EngineCommand round{EngineOrder::StreamedRound, step, first - static_cast<uint64_t>(rank * count), roles_.size() * count};
  if (prefetched_ && (prefetched_->step != round.step || prefetched_->first != round.first || prefetched_->count != round.count))
    throw std::logic_error("the prefetched round is of step " + std::to_string(prefetched_->step) + " from prompt " +
                           std::to_string(prefetched_->first) + ", the step asks for step " + std::to_string(step) +
                           " from prompt " + std::to_string(round.first));
  const bool collect_prefetched = std::exchange(prefetched_, std::nullopt).has_value();
  std::string reply;
  int64_t aborted = 0;
  double graph_setup_seconds = 0;
  if (roles_.link() != MPI_COMM_NULL) {
    try {
      if (collect_prefetched) {
        tell({EngineOrder::Collect});
        const GatheredRound gathered = gather_round(roles_.link(), "", 0);
        graph_setup_seconds = gathered.graph_setup_seconds;
        reply = groups_reply(gathered.groups);
      } else {
        tell(round);
        CollectedRound collected = collect_round(roles_.link(), round, decision, stop_requested_, roles_.trainers());
        for (const int64_t engine : collected.aborted) aborted += engine;
        graph_setup_seconds = collected.graph_setup_seconds;
        reply = collected.stopped.empty() ? groups_reply(collected.groups) : stop_reply(collected.stopped);
      }
    } catch (const RanksFailedError& error) {
      engines_left_ = true;  // they fail with this error too
      reply = error_reply(error.code(), error.what());
    }
  }
  RoundGroups groups = hand_on(reply, aborted, graph_setup_seconds);
  std::erase_if(groups.groups, [&](const SampledGroup& group) {
    return group.prompt_index < first || group.prompt_index >= first + static_cast<uint64_t>(count);
  });
  std::sort(groups.groups.begin(), groups.groups.end(),
            [](const SampledGroup& a, const SampledGroup& b) { return a.prompt_index < b.prompt_index; });
  return groups;
}

void RemoteRollout::prefetch(int64_t step, uint64_t first, int64_t count) {
  if (prefetched_) throw std::logic_error("a round is prefetched already");
  prefetched_ = EngineCommand{EngineOrder::Round, step, first, roles_.size() * count};
  tell(*prefetched_);
}

void RemoteRollout::discard() {
  if (!prefetched_) return;
  tell({EngineOrder::Discard});
  prefetched_.reset();
}

void RemoteRollout::announce(EngineOrder order) { tell({order}); }

void RemoteRollout::tell(const EngineCommand& command) {
  if (roles_.link() != MPI_COMM_NULL) broadcast_command(roles_.link(), command);
}

RoundGroups RemoteRollout::hand_on(std::string reply, int64_t aborted, double graph_setup_seconds) {
  broadcast_string(roles_.comm(), reply, 0, "the handing out of the rollout ranks' reply");
  struct {
    int64_t aborted;
    double graph_setup_seconds;
  } figures{aborted, graph_setup_seconds};
  MPI_Request request;
  MPI_Ibcast(&figures, sizeof figures, MPI_BYTE, 0, roles_.comm(), &request);
  wait_for_ranks(request, "the handing out of the rollout ranks' reply", roles_.comm());
  RoundGroups groups;
  groups.aborted_requests = figures.aborted;
  groups.graph_setup_seconds = figures.graph_setup_seconds;
  groups.groups = read_reply(reply, groups.stopped);
  return groups;
}

void RemoteRollout::finish() {
  announce(EngineOrder::Finish);
  engines_left_ = true;
}

}  // namespace tandem
