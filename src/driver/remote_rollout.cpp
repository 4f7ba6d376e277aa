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
  hand_on(reply);
}

std::vector<SampledGroup> RemoteRollout::sample(int64_t step, uint64_t first, int64_t count) {
  const int rank = roles_.rank();
  const EngineCommand round{EngineOrder::Round, step, first - static_cast<uint64_t>(rank * count), roles_.size() * count};
  if (!prefetched_)
    tell(round);
  else if (prefetched_->step != round.step || prefetched_->first != round.first || prefetched_->count != round.count)
    throw std::logic_error("the prefetched round is of step " + std::to_string(prefetched_->step) + " from prompt " +
                           std::to_string(prefetched_->first) + ", the step asks for step " + std::to_string(step) +
                           " from prompt " + std::to_string(round.first));
  prefetched_.reset();
  std::string reply;
  if (roles_.link() != MPI_COMM_NULL) {
    tell({EngineOrder::Collect});
    try {
      reply = groups_reply(gather_round(roles_.link(), ""));
    } catch (const RanksFailedError& error) {
      engines_left_ = true;  // they fail with this error too
      reply = error_reply(error.code(), error.what());
    }
  }
  std::vector<SampledGroup> groups = hand_on(reply);
  std::sort(groups.begin(), groups.end(),
            [](const SampledGroup& a, const SampledGroup& b) { return a.prompt_index < b.prompt_index; });
  const auto mine = groups.begin() + rank * count;
  return {std::make_move_iterator(mine), std::make_move_iterator(mine + count)};
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

std::vector<SampledGroup> RemoteRollout::hand_on(std::string reply) {
  broadcast_string(roles_.comm(), reply, 0, "the handing out of the rollout ranks' reply");
  return read_reply(reply);
}

void RemoteRollout::finish() {
  announce(EngineOrder::Finish);
  engines_left_ = true;
}

}  // namespace tandem
