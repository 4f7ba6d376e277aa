#include "world/stall_guard.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "world/log.h"
#include "world/table.h"

namespace tandem {

namespace {

// The tokens of one guarded communicator: each guarded collective on it sends one to the
// next rank and waits for one from the previous.
struct Ring {
  MPI_Comm key = MPI_COMM_NULL;     // the communicator the collectives run on
  MPI_Comm tokens = MPI_COMM_NULL;  // its duplicate, for the tokens
  int rank = 0, size = 1;
  int left_job_rank = 0;  // the previous rank, as the job numbers it (for the report)
  int token_out = 0, token_in = 0;
};

std::vector<std::unique_ptr<Ring>> rings;
MPI_Group job_group = MPI_GROUP_NULL;
MPI_Comm probes = MPI_COMM_NULL;  // the job's ranks, for "are you waiting too?" and its answer
int probe_serial = 0;             // of this rank's latest question
double timeout = 0;
constexpr int kQuestionTag = 1, kAnswerTag = 2;

// Answers every question that has come in: this rank is waiting itself, so it is alive.
void answer_questions() {
  for (;;) {
    int pending = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kQuestionTag, probes, &pending, &status);
    if (!pending) return;
    int serial = 0;
    MPI_Recv(&serial, 1, MPI_INT, status.MPI_SOURCE, kQuestionTag, probes, MPI_STATUS_IGNORE);
    MPI_Send(&serial, 1, MPI_INT, status.MPI_SOURCE, kAnswerTag, probes);
  }
}

// Whether `rank` has answered this rank's latest question; answers to earlier ones,
// come in after their collective completed, are dropped.
bool answered(int rank) {
  bool found = false;
  for (;;) {
    int pending = 0;
    MPI_Iprobe(rank, kAnswerTag, probes, &pending, MPI_STATUS_IGNORE);
    if (!pending) return found;
    int serial = 0;
    MPI_Recv(&serial, 1, MPI_INT, rank, kAnswerTag, probes, MPI_STATUS_IGNORE);
    found = found || serial == probe_serial;
  }
}

Ring* ring_of(MPI_Comm comm) {
  for (const auto& ring : rings)
    if (ring->key == comm) return ring.get();
  return nullptr;
}

[[noreturn]] void end_job(const std::string& message) {
  TLOG(error) << message;
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace

void set_stall_timeout(MPI_Comm comm, double timeout_seconds) {
  for (const auto& ring : rings) MPI_Comm_free(&ring->tokens);
  rings.clear();
  if (job_group != MPI_GROUP_NULL) MPI_Group_free(&job_group);
  MPI_Comm_group(comm, &job_group);
  if (probes != MPI_COMM_NULL) MPI_Comm_free(&probes);
  MPI_Comm_dup(comm, &probes);
  timeout = timeout_seconds;
  guard_collectives_on(comm);
}

void guard_collectives_on(MPI_Comm comm) {
  auto ring = std::make_unique<Ring>();
  ring->key = comm;
  MPI_Comm_dup(comm, &ring->tokens);
  MPI_Comm_rank(comm, &ring->rank);
  MPI_Comm_size(comm, &ring->size);
  int left = (ring->rank + ring->size - 1) % ring->size;
  MPI_Group group;
  MPI_Comm_group(comm, &group);
  MPI_Group_translate_ranks(group, 1, &left, job_group, &ring->left_job_rank);
  MPI_Group_free(&group);
  rings.push_back(std::move(ring));
}

void stop_guarding(MPI_Comm comm) {
  for (auto ring = rings.begin(); ring != rings.end(); ++ring)
    if ((*ring)->key == comm) {
      MPI_Comm_free(&(*ring)->tokens);
      rings.erase(ring);
      return;
    }
}

void wait_for_ranks(MPI_Request request, const char* what, MPI_Comm comm, const std::function<void()>& between_tests) {
  enum { kCollective, kTokenOut, kTokenIn, kArrival };
  MPI_Request requests[4] = {request, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  Ring* ring = ring_of(comm);
  const bool guarded = ring && ring->size > 1;
  if (guarded) {
    ++ring->token_out;
    MPI_Isend(&ring->token_out, 1, MPI_INT, (ring->rank + 1) % ring->size, 0, ring->tokens, &requests[kTokenOut]);
    MPI_Irecv(&ring->token_in, 1, MPI_INT, (ring->rank + ring->size - 1) % ring->size, 0, ring->tokens, &requests[kTokenIn]);
    MPI_Ibarrier(ring->tokens, &requests[kArrival]);
  }
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(0);
  bool reported = false;
  double asked_at = -1;  // when the silent neighbour was asked whether it waits too
  for (;;) {
    int done = 0;
    MPI_Testall(4, requests, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (between_tests) between_tests();
    if (timeout > 0) answer_questions();
    // Once every rank has arrived the bytes are moving, and MPI moves them only while it
    // is called: a large message sent in shared-memory fragments would wait up to a
    // sleep per fragment (a 2.4 GB all-reduce at MB/s). Until then a late rank is
    // waited for in sleeps, so a stopped one does not keep the others spinning.
    int arrived = 0;
    if (guarded) MPI_Test(&requests[kArrival], &arrived, MPI_STATUS_IGNORE);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout > 0 && waited > timeout && !reported) {
      int left_arrived = 0;
      MPI_Test(&requests[kTokenIn], &left_arrived, MPI_STATUS_IGNORE);
      // The silent neighbour may itself be waiting, in another collective, on the rank that
      // stopped: it is asked, and answers from its own wait. One that does not answer within
      // a grace has stopped (or has been busy outside every collective for longer than the
      // timeout) and is named.
      if (ring && !left_arrived) {
        if (asked_at < 0) {
          ++probe_serial;
          MPI_Send(&probe_serial, 1, MPI_INT, ring->left_job_rank, kQuestionTag, probes);
          asked_at = waited;
        } else if (answered(ring->left_job_rank)) {
          reported = true;  // it waits too, on a rank further on: that rank's neighbour names it
        } else if (waited > asked_at + std::min(1.0, timeout / 4)) {
          end_job("rank " + std::to_string(ring->left_job_rank) + " has not reached " + what + " for " +
                  format_fixed(waited, 1) + " s (world.stall-timeout): it stopped answering; ending the job");
        }
      } else {
        reported = true;  // the silent rank is further round the ring: its neighbour names it
      }
    }
    // Give that neighbour time to report before ending the job from here.
    if (reported && waited > 2 * timeout + 5)
      end_job(std::string("waited ") + format_fixed(waited, 1) + " s in " + what + " (world.stall-timeout): a rank stopped answering; ending the job");
    if (arrived) {
      std::this_thread::yield();  // the ranks may share cores
    } else {
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
      pause = std::min(std::chrono::microseconds(1000), pause * 2 + std::chrono::microseconds(1));
    }
  }
}

void all_reduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char* what) {
  MPI_Request request;
  MPI_Iallreduce(send, receive, count, type, op, comm, &request);
  wait_for_ranks(request, what, comm);
}

void all_gather(const void* send, int count, MPI_Datatype type, void* receive, MPI_Comm comm, const char* what) {
  MPI_Request request;
  MPI_Iallgather(send, count, type, receive, count, type, comm, &request);
  wait_for_ranks(request, what, comm);
}

}  // namespace tandem
