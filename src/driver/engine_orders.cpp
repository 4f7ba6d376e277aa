#include "driver/engine_orders.h"

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

std::vector<SampledGroup> read_reply(const std::string& reply, std::string& stopped) {
  throw_errors({reply});
  if (reply_kind(reply) == ReplyKind::Stop) {
    stopped = reply.substr(1);
    return {};
  }
  return read_groups(std::string_view(reply).substr(1));
}

}  // namespace tandem
