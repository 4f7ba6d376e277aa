#include "driver/engine_orders.h"

#include <algorithm>

#include "world/stall_guard.h"
#include "world/world.h"

namespace tandem {

EngineCommand broadcast_command(MPI_Comm link, const EngineCommand& command) {
  EngineCommand received = command;
  MPI_Request request;
  MPI_Ibcast(&received, sizeof received, MPI_BYTE, 0, link, &request);
  wait_for_ranks(request, "the rollout ranks' next order", link);
  return received;
}

std::vector<uint64_t> engine_share(const EngineCommand& round, int engine, int engines) {
  std::vector<uint64_t> indices;
  for (int64_t position = engine; position < round.count; position += engines)
    indices.push_back(round.first + static_cast<uint64_t>(position));
  return indices;
}

std::string groups_reply(const std::vector<SampledGroup>& groups) { return "G" + write_groups(groups); }

std::string error_reply(ExitCode code, const std::string& message) {
  return "E" + std::to_string(static_cast<int>(code)) + ":" + message;
}

std::string stop_reply(const std::string& why) { return "S" + why; }

ReplyKind reply_kind(const std::string& reply) {
  if (!reply.empty() && reply[0] == 'E') return ReplyKind::Error;
  if (!reply.empty() && reply[0] == 'S') return ReplyKind::Stop;
  return ReplyKind::Groups;
}

void throw_errors(const std::vector<std::string>& replies) {
  std::string errors;
  ExitCode code = kExitDone;
  for (const std::string& reply : replies) {
    if (reply_kind(reply) != ReplyKind::Error) continue;
    const size_t colon = reply.find(':');
    if (code == kExitDone) code = static_cast<ExitCode>(std::stoi(reply.substr(1, colon - 1)));
    errors += (errors.empty() ? "" : "; ") + reply.substr(colon + 1);
  }
  if (!errors.empty()) throw RanksFailedError(code, errors);
}

void fail_together_on_link(MPI_Comm link, const std::string& reply) {
  // Every gathering waits through the stall guard: a rank that stopped is named.
  int size = 1;
  MPI_Comm_size(link, &size);
  const int failed = reply_kind(reply) == ReplyKind::Error;
  std::vector<int> failures(size);
  all_gather(&failed, 1, MPI_INT, failures.data(), link, "the gathering of the rollout ranks' replies");
  if (std::count(failures.begin(), failures.end(), 1) > 0) throw_errors(all_gather_strings(link, failed ? reply : ""));
}

GatheredRound gather_round(MPI_Comm link, const std::string& reply, double graph_setup_seconds) {
  // The errors first, to every rank, so they all fail together; then the groups to rank 0.
  fail_together_on_link(link, reply);
  int rank = 0, size = 1;
  MPI_Comm_rank(link, &rank);
  MPI_Comm_size(link, &size);
  const std::string bytes = reply.empty() ? std::string() : reply.substr(1);
  int length = static_cast<int>(bytes.size());
  std::vector<int> lengths(size), offsets(size);
  MPI_Request request;
  MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, link, &request);
  wait_for_ranks(request, "the gathering of a round's groups", link);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(rank == 0 ? total : 0, '\0');
  MPI_Igatherv(bytes.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, link, &request);
  wait_for_ranks(request, "the gathering of a round's groups", link);
  GatheredRound round;
  MPI_Ireduce(&graph_setup_seconds, &round.graph_setup_seconds, 1, MPI_DOUBLE, MPI_MAX, 0, link, &request);
  wait_for_ranks(request, "the gathering of a round's groups", link);
  if (rank != 0) return {};
  for (int r = 1; r < size; ++r) {
    std::vector<SampledGroup> theirs = read_groups(std::string_view(all).substr(offsets[r], lengths[r]));
    round.groups.insert(round.groups.end(), std::make_move_iterator(theirs.begin()), std::make_move_iterator(theirs.end()));
  }
  return round;
}

std::vector<SampledGroup> read_reply(const std::string& reply, std::string& stopped) {
  throw_errors({reply});
  if (reply_kind(reply) == ReplyKind::Stop) {
    stopped = reply.substr(1);
    return {};
  }
  return read_groups(std::string_view(reply).substr(1));
}

}  // namespace tandem
