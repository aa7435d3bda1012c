// The processes of one job and the few collective operations data-parallel training needs.
//
// Every call to MPI (Open MPI's C API) lives in engine/distributed/ranks.cpp, behind this small
// interface. A process started without mpirun, or a build without MPI (the Meson feature
// `mpi`), is a job of one: rank 0 of size 1, and every collective copies its own buffer.
// MPI is started on first use and finished when the process exits normally.
//
// Collectives and messages are called from the main thread only, collectives by every rank
// in the same order (MPI_THREAD_SERIALIZED; Exchange included). The one
// exception is rank 0's dispatcher thread in for_each_item, which talks to the other ranks
// while the main thread works on items and makes no MPI call.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/error.h"

namespace adjoint::distributed {

// Whether this build can talk to other processes (compiled with MPI).
bool built_with_mpi();

// This process's index in the job, 0 … size() − 1, and the number of processes.
int rank();
int size();

// Every rank gives `count` values; `all` (size() · count values) receives them in rank
// order: rank r's values at all[r · count …]. The same count on every rank. Point to point
// (each rank's values sent to every other), so that a rank that does not arrive within
// rank_timeout() is named (RankTimeout).
void allgather(const float* mine, int64_t count, float* all);
void allgather(const double* mine, int64_t count, double* all);

// How long a rank waits for another rank's part of an exchange (Exchange::wait, allgather)
// before it gives up (--rank-timeout); 300 s unless set. Set it on every rank alike.
void set_rank_timeout(double seconds);
double rank_timeout();

// Thrown when a rank's part of an exchange did not arrive within rank_timeout(): names the
// rank. The caller adds what it was doing (the step) and ends the job (abort).
class RankTimeout : public Error {
public:
  RankTimeout(int missing_rank, const std::string& message) : Error(message), missing(missing_rank) {}
  int missing;
};

// Point-to-point messages that run while this process goes on working (MPI_Isend and
// MPI_Irecv): each send and receive names its peer rank and a tag, and a receive matches
// the sends of its peer under its tag in the order they were posted. Until test() or wait()
// says every message is done, neither a sent nor a received buffer may be touched. A job
// of one has no peers: both throw. Main thread only, as every MPI call. Tags from
// 0 to max_tag(); the tags of allgather and broadcast (below) are their own.
class Exchange {
public:
  Exchange();
  Exchange(Exchange&& other) noexcept;
  Exchange& operator=(Exchange&& other) = delete;
  // Waits for messages still pending, unless an exception is on its way (then lets go).
  ~Exchange();
  void send(const void* bytes, int64_t count, int to, int tag);
  void receive(void* bytes, int64_t count, int from, int tag);
  template <class T>
  void send_values(const T* values, int64_t count, int to, int tag) { send(values, count * int64_t(sizeof(T)), to, tag); }
  template <class T>
  void receive_values(T* values, int64_t count, int from, int tag) {
    receive(values, count * int64_t(sizeof(T)), from, tag);
  }
  // Lets MPI move the messages on (Open MPI progresses them only inside MPI calls) and
  // returns whether every one is done.
  bool test();
  // Returns once every message is done; throws RankTimeout naming the first peer whose
  // message is not, once rank_timeout() has passed since the call.
  void wait();
  // The bytes handed to send() so far.
  int64_t bytes_sent() const { return bytes_sent_; }

private:
  struct Requests;  // MPI's request handles, kept out of this header
  std::unique_ptr<Requests> requests_;
  int64_t bytes_sent_ = 0;
};
int max_tag();

// Rank `root`'s `count` values copied into `values` on every rank. Point to point (the
// root's values sent to every other rank), under the deadline of allgather: a rank whose
// root does not send within rank_timeout() names it (RankTimeout), and a root whose values
// a rank does not take names that rank.
void broadcast(float* values, int64_t count, int root = 0);

// Rank `root`'s text copied into `text` on every rank, as above (its length, then its bytes).
void broadcast(std::string& text, int root = 0);

// Returns when every rank has called it. No deadline: its callers (the sweeps) wait there
// for other ranks' last cells, which may take longer than any exchange's deadline.
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

// for_each_item where an item may need others done first: needs[i] lists earlier items
// (each below i) that item i reads. Rank 0 hands out, to whichever rank asks, the first item
// in order whose needs are all done; a rank that asks while none is ready waits for one. In a
// job of one, the items in order. `needs` empty: no item needs another (for_each_item).
// Under the test hook above, no item may need another.
void for_each_item(int64_t count, const std::vector<std::vector<int64_t>>& needs,
                   const std::function<void(int64_t item)>& work);

// While one is alive, this process is a job of one to every caller: rank() 0, size() 1, each
// collective copies its own buffer, no MPI call is made. For work handed to one rank that is
// a whole run of its own (a part of `reproduce`: a command line that may train or sweep).
// abort() still names the real rank, and for_each_item's dispatcher still talks to the others.
class JobOfOne {
public:
  JobOfOne();
  ~JobOfOne();
  JobOfOne(const JobOfOne&) = delete;
  JobOfOne& operator=(const JobOfOne&) = delete;
};

// Test hook: ADJOINT_TEST_RANK_STALLS_AT="r:n" makes rank r sleep for an hour when it
// calls this with `step` n and `point` "step", and "r:n:POINT" when it calls this with
// `step` n and that `point` (a rank that stops, as a stuck node, at a chosen place, for the
// tests of --rank-timeout); nothing otherwise.
void stall_if_asked(int64_t step, const char* point = "step");

// Ends the whole job with `code` (every rank), after one line on stderr naming this rank.
[[noreturn]] void abort(int code, const char* message);

}  // namespace adjoint::distributed
