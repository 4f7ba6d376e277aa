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

RoundGroups RemoteRollout::sample(int64_t step, uint64_t first, int64_t count, const BatchDecision& decision) {
  const int rank = roles_.rank(), trainers = roles_.size();
  const uint64_t round_first = first - static_cast<uint64_t>(rank * count);
  std::string reply;
  int64_t aborted = 0;
  if (roles_.link() != MPI_COMM_NULL) {
    const EngineCommand order{EngineOrder::Round, step, round_first, trainers * count};
    broadcast_command(roles_.link(), order);
    try {
      CollectedRound round = collect_round(roles_.link(), order, decision, stop_requested_, roles_.trainers());
      for (const int64_t engine : round.aborted) aborted += engine;
      reply = round.stopped.empty() ? groups_reply(round.groups) : stop_reply(round.stopped);
    } catch (const RanksFailedError& error) {
      engines_left_ = true;  // they fail with this error too
      reply = error_reply(error.code(), error.what());
    }
  }
  broadcast_string(roles_.comm(), reply, 0, "the handing out of a round's groups");
  MPI_Request request;
  MPI_Ibcast(&aborted, 1, MPI_INT64_T, 0, roles_.comm(), &request);
  wait_for_ranks(request, "the handing out of a round's groups", roles_.comm());
  RoundGroups mine;
  mine.aborted_requests = aborted;
  for (SampledGroup& group : read_reply(reply, mine.stopped))
    if (group.prompt_index >= first && group.prompt_index < first + static_cast<uint64_t>(count))
      mine.groups.push_back(std::move(group));
  return mine;
}

void RemoteRollout::announce(EngineOrder order) {
  if (roles_.link() != MPI_COMM_NULL) broadcast_command(roles_.link(), {order});
}

void RemoteRollout::finish() {
  announce(EngineOrder::Finish);
  engines_left_ = true;
}

}  // namespace tandem
