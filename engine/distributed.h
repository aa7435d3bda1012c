// The processes of one job and the few collective operations data-parallel training needs.
//
// Every call to MPI (Open MPI's C API) lives in engine/distributed.cpp, behind this small
// interface. A process started without mpirun, or a build without MPI (the Meson feature
// `mpi`), is a job of one: rank 0 of size 1, and every collective copies its own buffer.
// MPI is started on first use and finished when the process exits normally.
//
// Collectives are called from the main thread only, by every rank in the same order
// (MPI_THREAD_SERIALIZED; start_allgather and PendingGather::wait included). The one
// exception is rank 0's dispatcher thread in for_each_item, which talks to the other ranks
// while the main thread works on items and makes no MPI call.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace adjoint::distributed {

// Whether this build can talk to other processes (compiled with MPI).
bool built_with_mpi();

// This process's index in the job, 0 … size() − 1, and the number of processes.
int rank();
int size();

// Every rank gives `count` values; `all` (size() · count values) receives them in rank
// order: rank r's values at all[r · count …]. The same count on every rank.
void allgather(const float* mine, int64_t count, float* all);
void allgather(const double* mine, int64_t count, double* all);

// An all-gather that runs while this process goes on working (MPI_Iallgather): started by
// start_allgather, finished by wait(). Until then neither buffer may be touched (`mine` not
// changed, `all` not read). Every rank starts the same gathers in the same order (as for
// any collective), from the main thread. The destructor waits for one still pending. In a
// job of one, start_allgather copies and wait() returns at once.
class PendingGather {
public:
  PendingGather();
  PendingGather(PendingGather&& other) noexcept;
  // Waits for the gather this one holds, if any, before taking the other's.
  PendingGather& operator=(PendingGather&& other);
  ~PendingGather();
  // Returns when `all` holds every rank's values.
  void wait();
  // Lets MPI move the gather on and returns whether it has finished (then as wait()). Open MPI
  // progresses a nonblocking collective only inside MPI calls, so a caller that wants the
  // transfer to advance during its own work calls this now and then.
  bool test();
  // Whether it was started and not yet waited for.
  bool pending() const;

private:
  friend PendingGather start_allgather(const float* mine, int64_t count, float* all);
  struct Request;  // MPI's request handle, kept out of this header
  std::unique_ptr<Request> request_;
};
// Starts allgather(mine, count, all) and returns at once.
PendingGather start_allgather(const float* mine, int64_t count, float* all);

// Rank `root`'s `count` values copied into `values` on every rank.
void broadcast(float* values, int64_t count, int root = 0);

// Rank `root`'s text copied into `text` on every rank.
void broadcast(std::string& text, int root = 0);

// Returns when every rank has called it.
void barrier();

// Point to point: `count` 64-bit integers sent to rank `to` under `tag` (a few values: work
// requests and answers, not bulk data). receive waits (sleeping, not spinning) for a message
// under `tag` from rank `from`, or from any rank with any_rank, and returns its sender. In a
// job of one there is no one to talk to: both throw.
constexpr int any_rank = -1;
void send(const int64_t* values, int count, int to, int tag);
int receive(int64_t* values, int count, int from, int tag);

// Calls work(item) for every item 0 … count − 1, each on exactly one rank: rank 0 hands the
// items out in order, one at a time, to whichever rank asks next (rank 0 itself works too,
// its main thread taking items while a second thread answers the others), so a slow item
// holds no other back. Returns on every rank once every item is done. In a job of one, the
// items in order. An exception from work on one rank ends the whole job (abort) with its
// message, exit code 2 for a UsageError, so that no rank waits forever.
// Test hook: ADJOINT_TEST_RANK_DIES_AFTER="r:n" (r > 0) kills rank r (SIGKILL) when it is
// handed an item after finishing n: it dies holding an item it never finishes, as a node that
// fails. With the hook set, rank 0 works on no item and hands them to ranks 1 … K − 1 in turn,
// so rank r is handed items r − 1, r − 1 + (K − 1), …: the test knows it dies on item
// r − 1 + n·(K − 1), whatever the timing.
void for_each_item(int64_t count, const std::function<void(int64_t item)>& work);

// Ends the whole job with `code` (every rank), after one line on stderr naming this rank.
[[noreturn]] void abort(int code, const char* message);

}  // namespace adjoint::distributed
