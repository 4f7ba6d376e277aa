#include "world/stall_guard.h"

#include <chrono>
#include <thread>

#include "world/log.h"
#include "world/table.h"

namespace tandem {

namespace {

MPI_Comm token_comm = MPI_COMM_NULL;
int rank = 0, size = 1;
double timeout = 0;
int token_out = 0, token_in = 0;

// The rank before this one in the ring: its token says it reached the collective.
int left() { return (rank + size - 1) % size; }

[[noreturn]] void end_job(const std::string& message) {
  TLOG(error) << message;
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace

void set_stall_timeout(MPI_Comm comm, double timeout_seconds) {
  if (token_comm != MPI_COMM_NULL) MPI_Comm_free(&token_comm);
  MPI_Comm_dup(comm, &token_comm);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  timeout = timeout_seconds;
}

void wait_for_ranks(MPI_Request request, const char* what) {
  MPI_Request requests[3] = {request, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  if (token_comm != MPI_COMM_NULL && size > 1) {
    ++token_out;
    MPI_Isend(&token_out, 1, MPI_INT, (rank + 1) % size, 0, token_comm, &requests[1]);
    MPI_Irecv(&token_in, 1, MPI_INT, left(), 0, token_comm, &requests[2]);
  }
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(0);
  bool reported = false;
  for (;;) {
    int done = 0;
    MPI_Testall(3, requests, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout > 0 && waited > timeout && !reported) {
      int left_arrived = 0;
      MPI_Test(&requests[2], &left_arrived, MPI_STATUS_IGNORE);
      if (!left_arrived)
        end_job("rank " + std::to_string(left()) + " has not reached " + what + " for " + format_fixed(waited, 1) +
                " s (world.stall-timeout): it stopped answering; ending the job");
      reported = true;  // the silent rank is further round the ring: its neighbour names it
    }
    // Give that neighbour time to report before ending the job from here.
    if (reported && waited > 2 * timeout + 5)
      end_job(std::string("waited ") + format_fixed(waited, 1) + " s in " + what + " (world.stall-timeout): a rank stopped answering; ending the job");
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    pause = std::min(std::chrono::microseconds(1000), pause * 2 + std::chrono::microseconds(1));
  }
}

void all_reduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char* what) {
  MPI_Request request;
  MPI_Iallreduce(send, receive, count, type, op, comm, &request);
  wait_for_ranks(request, what);
}

void all_gather(const void* send, int count, MPI_Datatype type, void* receive, MPI_Comm comm, const char* what) {
  MPI_Request request;
  MPI_Iallgather(send, count, type, receive, count, type, comm, &request);
  wait_for_ranks(request, what);
}

}  // namespace tandem
