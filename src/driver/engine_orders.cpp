#include "driver/engine_orders.h"

#include "world/stall_guard.h"

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

std::vector<SampledGroup> read_replies(const std::vector<std::string>& replies) {
  std::vector<SampledGroup> groups;
  std::string errors;
  ExitCode code = kExitDone;
  for (size_t i = 0; i < replies.size(); ++i) {
    const std::string& reply = replies[i];
    if (reply.empty()) continue;
    if (reply[0] == 'E') {
      const size_t colon = reply.find(':');
      if (code == kExitDone) code = static_cast<ExitCode>(std::stoi(reply.substr(1, colon - 1)));
      errors += (errors.empty() ? "" : "; ") + reply.substr(colon + 1);
      continue;
    }
    std::vector<SampledGroup> theirs = read_groups(std::string_view(reply).substr(1));
    groups.insert(groups.end(), std::make_move_iterator(theirs.begin()), std::make_move_iterator(theirs.end()));
  }
  if (!errors.empty()) throw RanksFailedError(code, errors);
  return groups;
}

}  // namespace tandem
