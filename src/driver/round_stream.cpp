#include "driver/round_stream.h"

#include <algorithm>
#include <optional>

#include "world/log.h"
#include "world/stall_guard.h"
#include "world/world.h"

namespace tandem {

namespace {

constexpr int kMessageTag = 71;  // engine -> trainer rank 0: a groups, error or stop reply
constexpr int kEndTag = 72;      // trainer rank 0 -> engine: the round is over

enum class Ending : int32_t { Open, Complete, BatchDecided, Stop, Failed };

// One rank's part of the close (trainer rank 0's is all zero).
struct CloseRecord {
  int64_t failed = 0, aborted = 0, held = 0, sent = 0;
  double graph_setup_seconds = 0;
};

// Collective over the link: every rank's record, waiting through the stall guard.
std::vector<CloseRecord> gather_close(MPI_Comm link, const CloseRecord& mine, const std::function<void()>& between_tests) {
  int size = 1;
  MPI_Comm_size(link, &size);
  std::vector<CloseRecord> records(size);
  MPI_Request request;
  MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, records.data(), sizeof mine, MPI_BYTE, link, &request);
  wait_for_ranks(request, "the close of a round", link, between_tests);
  return records;
}

// Collective over the link: when any engine failed, every rank throws every engine's error.
void fail_if_any_failed(MPI_Comm link, const std::vector<CloseRecord>& records, const std::string& error) {
  for (const CloseRecord& record : records)
    if (record.failed) throw_errors(all_gather_strings(link, error));
}

void send_reply(MPI_Comm link, const std::string& reply) {
  MPI_Send(reply.data(), static_cast<int>(reply.size()), MPI_CHAR, 0, kMessageTag, link);
}

// The next engine's message, if one has arrived (or, blocking, once one does).
std::optional<std::string> receive_reply(MPI_Comm link, bool block) {
  int found = 1;
  MPI_Message message;
  MPI_Status status;
  if (block)
    MPI_Mprobe(MPI_ANY_SOURCE, kMessageTag, link, &message, &status);
  else
    MPI_Improbe(MPI_ANY_SOURCE, kMessageTag, link, &found, &message, &status);
  if (!found) return std::nullopt;
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  std::string reply(length, '\0');
  MPI_Mrecv(reply.data(), length, MPI_CHAR, &message, MPI_STATUS_IGNORE);
  return reply;
}

}  // namespace

EngineRound::EngineRound(MPI_Comm link) : link_(link) { MPI_Irecv(&ending_, 1, MPI_INT32_T, 0, kEndTag, link, &end_); }

void EngineRound::send_group(const SampledGroup& group) {
  send_reply(link_, groups_reply({group}));
  ++sent_;
}

void EngineRound::fail(ExitCode code, const std::string& message) {
  error_ = error_reply(code, message);
  send_reply(link_, error_);
  ++sent_;
}

void EngineRound::send_stop(const std::string& why) {
  if (stop_sent_) return;
  send_reply(link_, stop_reply(why));
  ++sent_;
  stop_sent_ = true;
}

bool EngineRound::ended() {
  int done = 0;
  MPI_Test(&end_, &done, MPI_STATUS_IGNORE);
  return done;
}

void EngineRound::close(int64_t aborted, int64_t held, double graph_setup_seconds) {
  const std::vector<CloseRecord> records =
      gather_close(link_, {!error_.empty(), aborted, held, sent_, graph_setup_seconds}, {});
  MPI_Wait(&end_, MPI_STATUS_IGNORE);  // trainer rank 0 ends the round at the latest once the close is complete
  fail_if_any_failed(link_, records, error_);
}

CollectedRound collect_round(MPI_Comm link, const EngineCommand& round, const BatchDecision& decision,
                             const std::function<std::string()>& stop_requested, int first_engine) {
  int size = 1;
  MPI_Comm_size(link, &size);
  std::vector<std::optional<SampledGroup>> slots(round.count);
  std::vector<double> leading_rewards;  // of the complete groups before the first missing one
  int64_t received_groups = 0, received_messages = 0, leading = 0, decided = 0;
  CollectedRound collected;
  Ending ending = Ending::Open;
  std::vector<MPI_Request> end_sends(size - 1, MPI_REQUEST_NULL);
  auto end_round = [&](Ending how) {
    ending = how;
    for (int engine = 1; engine < size; ++engine)
      MPI_Isend(&ending, 1, MPI_INT32_T, engine, kEndTag, link, &end_sends[engine - 1]);
  };
  const auto open_groups_missing = [&] { return ending == Ending::Open && received_groups < round.count; };
  auto take = [&](const std::string& reply) {
    ++received_messages;
    if (reply_kind(reply) == ReplyKind::Error) {
      if (ending == Ending::Open) end_round(Ending::Failed);  // the close brings its message
      return;
    }
    std::vector<SampledGroup> groups = read_reply(reply, collected.stopped);
    if (!collected.stopped.empty() && open_groups_missing()) end_round(Ending::Stop);
    for (SampledGroup& group : groups) {
      slots[group.prompt_index - round.first] = std::move(group);
      ++received_groups;
    }
    for (; leading < round.count && slots[leading]; ++leading) {
      const std::vector<double> rewards = slots[leading]->rewards();
      leading_rewards.insert(leading_rewards.end(), rewards.begin(), rewards.end());
    }
    if (ending == Ending::Open && (decided = decision.decided_by(leading_rewards)) > 0) end_round(Ending::BatchDecided);
  };
  const std::vector<CloseRecord> records = gather_close(link, {}, [&] {
    while (const auto reply = receive_reply(link, false)) take(*reply);
    if (!open_groups_missing()) return;
    if (std::string why = stop_requested(); !why.empty()) {
      collected.stopped = why;
      end_round(Ending::Stop);
    }
  });
  int64_t sent = 0, aborted = 0, held = 0;
  for (const CloseRecord& record : records) {
    sent += record.sent;
    aborted += record.aborted;
    held += record.held;
    collected.graph_setup_seconds = std::max(collected.graph_setup_seconds, record.graph_setup_seconds);
  }
  while (received_messages < sent) take(*receive_reply(link, true));  // sent before their close: on the way
  if (ending == Ending::Open) end_round(Ending::Complete);
  MPI_Waitall(static_cast<int>(end_sends.size()), end_sends.data(), MPI_STATUSES_IGNORE);
  fail_if_any_failed(link, records, "");

  std::string counts;
  for (int engine = 1; engine < size; ++engine) {
    collected.aborted.push_back(records[engine].aborted);
    counts += (engine > 1 ? ", " : "") + std::string("rank ") + std::to_string(first_engine + engine - 1) + ": " +
              std::to_string(records[engine].aborted);
  }
  if (ending == Ending::Stop) {
    TLOG(warning) << "the rollout of step " << round.step << " is cut (" << collected.stopped << "); requests aborted per rollout rank: "
                  << counts << " (" << aborted << " in all); " << held << " left queued or running";
    return collected;
  }
  const int64_t kept = decided > 0 ? decided : round.count;
  if (aborted > 0 || decided > 0)
    TLOG(info) << "round of step " << round.step << ": the first " << kept << " of " << round.count
               << " groups decide the batch; requests aborted per rollout rank: " << counts << " (" << aborted
               << " in all); " << held << " left queued or running";
  for (int64_t position = 0; position < kept; ++position) collected.groups.push_back(std::move(*slots[position]));
  return collected;
}

}  // namespace tandem
