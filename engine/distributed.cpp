#include "engine/distributed.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"

#ifdef ADJOINT_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: no C++ bindings
#include <mpi.h>
#endif

namespace adjoint::distributed {

namespace {

// How this process was started, read from the variables launchers set: by Open MPI's
// mpirun, by Slurm's srun with PMIx (--mpi=pmix: MPI finds the other tasks through it), by
// a plain srun (Slurm's variables but no PMI: the tasks cannot find each other), or alone.
struct Launch {
  std::string launcher;  // "mpirun", "srun --mpi=pmix", "srun"; empty: alone
  int tasks = 1;         // the processes started together
  bool can_join = true;  // MPI can wire them into one job
};

int number_in(const char* variable) {
  const char* text = std::getenv(variable);
  return text ? std::atoi(text) : 0;
}

Launch launch() {
  if (number_in("OMPI_COMM_WORLD_SIZE") > 0) return {"mpirun", number_in("OMPI_COMM_WORLD_SIZE"), true};
  // srun sets the step's task count for the processes of a step (an sbatch script itself,
  // one process, has no step count of its own).
  const int step_tasks = number_in("SLURM_STEP_NUM_TASKS");
  if (std::getenv("PMIX_RANK") && step_tasks > 0) return {"srun --mpi=pmix", step_tasks, true};
  if (step_tasks > 1) return {"srun", step_tasks, false};
  return {};
}

#ifdef ADJOINT_HAVE_MPI
struct Job {
  bool mpi = false;  // MPI started: a process launched by mpirun
  bool serialized = false;  // MPI may be called from a second thread (one at a time)
  int rank = 0, size = 1;
  // The point-to-point messages of Exchange and allgather, apart from the work queue's
  // (for_each_item) and the collectives.
  MPI_Comm exchange = MPI_COMM_NULL;
  int tag_ub = 32767;  // the largest tag MPI allows (at least 32767 by the standard)
};

void finish_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(cat("MPI ", what, " failed: ", std::string(text, size_t(length))));
}

// Started on first use, so that a process that never trains in parallel, and every
// process started without mpirun, never initialises MPI.
const Job& job() {
  static const Job the_job = [] {
    Job j;
    const Launch how = launch();
    if (how.launcher.empty()) return j;
    if (!how.can_join)
      throw Error(cat(how.launcher, " started this adjoint as one of ", how.tasks,
                      " tasks without PMI, so they cannot find each other; launch with srun --mpi=pmix (or mpirun)"));
    int provided = 0;
    // Serialized: rank 0's dispatcher thread (for_each_item) calls MPI while the main thread
    // works; never two threads at once.
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    j.serialized = provided >= MPI_THREAD_SERIALIZED;
    std::atexit(finish_mpi);
    // Errors come back as codes (then exceptions naming the call), not as MPI's own abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &j.size);
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &j.exchange), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(j.exchange, MPI_ERRORS_RETURN);
    int* tag_ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
    if (found && tag_ub) j.tag_ub = *tag_ub;
    j.mpi = true;
    return j;
  }();
  return the_job;
}

int checked_count(int64_t count) {
  check(count >= 0 && count <= std::numeric_limits<int>::max(), "distributed: ", count,
        " values in one collective; at most ", std::numeric_limits<int>::max());
  return int(count);
}

// The tag of allgather's messages: above every tag Exchange's callers may use.
int gather_tag() { return job().tag_ub; }

// allgather as point-to-point messages under a deadline: each rank's values to every
// other, so that the rank that does not arrive is named.
template <class T>
void allgather_named(const T* mine, int64_t count, T* all) {
  if (!job().mpi) {
    if (count > 0 && all != mine) std::memmove(all, mine, size_t(count) * sizeof(T));
    return;
  }
  const int me = job().rank;
  if (all + me * count != mine) std::memmove(all + me * count, mine, size_t(count) * sizeof(T));
  Exchange exchange;
  for (int peer = 0; peer < job().size; ++peer) {
    if (peer == me) continue;
    exchange.receive_values(all + peer * count, count, peer, gather_tag());
    exchange.send_values(all + me * count, count, peer, gather_tag());
  }
  exchange.wait();
}

// Waits for a request to complete, sleeping between looks: Open MPI's blocking calls spin,
// which on an oversubscribed machine takes the core from a rank that is still working.
void wait_quietly(MPI_Request& request, MPI_Status* status, const char* what) {
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, status ? status : MPI_STATUS_IGNORE), what);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}
#else
// Without MPI a process started by mpirun would think it is alone, and K copies of the same
// run would write the same files: refused.
struct Job {
  int rank = 0, size = 1;
};
const Job& job() {
  static const Job the_job = [] {
    const Launch how = launch();
    if (how.tasks > 1)
      throw Error(cat("this adjoint was built without MPI (Meson feature 'mpi'), but ", how.launcher,
                      " started it as one of ", how.tasks, " ranks; install libopenmpi-dev and rebuild, or run it without ",
                      how.launcher));
    return Job{};
  }();
  return the_job;
}
template <class T>
void allgather_values(const T* mine, int64_t count, T* all) {
  job();
  if (count > 0 && all != mine) std::memmove(all, mine, size_t(count) * sizeof(T));
}
#endif

}  // namespace

bool built_with_mpi() {
#ifdef ADJOINT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int rank() { return job().rank; }
int size() { return job().size; }

#ifdef ADJOINT_HAVE_MPI
void allgather(const float* mine, int64_t count, float* all) { allgather_named(mine, count, all); }
void allgather(const double* mine, int64_t count, double* all) { allgather_named(mine, count, all); }

void broadcast(float* values, int64_t count, int root) {
  if (!job().mpi) return;
  check_mpi(MPI_Bcast(values, checked_count(count), MPI_FLOAT, root, MPI_COMM_WORLD), "MPI_Bcast");
}

void broadcast(std::string& text, int root) {
  if (!job().mpi) return;
  int64_t length = int64_t(text.size());
  check_mpi(MPI_Bcast(&length, 1, MPI_INT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  text.resize(size_t(length));
  check_mpi(MPI_Bcast(text.data(), checked_count(length), MPI_CHAR, root, MPI_COMM_WORLD), "MPI_Bcast");
}

void barrier() {
  if (job().mpi) check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void send(const int64_t* values, int count, int to, int tag) {
  check(job().mpi, "distributed: send to rank ", to, " in a job of one process");
  check_mpi(MPI_Send(values, count, MPI_INT64_T, to, tag, MPI_COMM_WORLD), "MPI_Send");
}

int receive(int64_t* values, int count, int from, int tag) {
  check(job().mpi, "distributed: receive from rank ", from, " in a job of one process");
  MPI_Request request;
  MPI_Status status;
  check_mpi(MPI_Irecv(values, count, MPI_INT64_T, from == any_rank ? MPI_ANY_SOURCE : from, tag, MPI_COMM_WORLD, &request),
            "MPI_Irecv");
  wait_quietly(request, &status, "MPI_Irecv");
  return status.MPI_SOURCE;
}

namespace {
void barrier_quietly() {
  MPI_Request request;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &request), "MPI_Ibarrier");
  wait_quietly(request, nullptr, "MPI_Ibarrier");
}
}  // namespace

void abort(int code, const char* message) {
  std::fprintf(stderr, "rank %d of %d: %s\n", job().rank, job().size, message);
  std::fflush(stderr);
  if (job().mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}
#else
void allgather(const float* mine, int64_t count, float* all) { allgather_values(mine, count, all); }
void send(const int64_t*, int, int to, int) { throw Error(cat("distributed: send to rank ", to, " in a build without MPI")); }
int receive(int64_t*, int, int from, int) {
  throw Error(cat("distributed: receive from rank ", from, " in a build without MPI"));
}
void allgather(const double* mine, int64_t count, double* all) { allgather_values(mine, count, all); }
void broadcast(float*, int64_t, int) { job(); }
void broadcast(std::string&, int) { job(); }
void barrier() { job(); }
void abort(int code, const char* message) {
  std::fprintf(stderr, "%s\n", message);
  std::exit(code);
}
#endif


namespace {
std::atomic<double> timeout_seconds{300.0};
}  // namespace

void set_rank_timeout(double seconds) {
  check(seconds > 0 && std::isfinite(seconds), "distributed: a rank timeout of ", seconds, " s");
  timeout_seconds = seconds;
}
double rank_timeout() { return timeout_seconds; }

void stall_if_asked(int64_t step) {
  const char* hook = std::getenv("ADJOINT_TEST_RANK_STALLS_AT");
  int stalling = -1;
  long long at = -1;
  if (!hook || std::sscanf(hook, "%d:%lld", &stalling, &at) != 2) return;
  if (stalling == rank() && at == step) std::this_thread::sleep_for(std::chrono::hours(1));
}

#ifdef ADJOINT_HAVE_MPI
struct Exchange::Requests {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;  // each request's peer rank
  std::vector<bool> receives;
};

int max_tag() { return job().tag_ub - 1; }

void Exchange::send(const void* bytes, int64_t count, int to, int tag) {
  check(job().mpi && to != job().rank, "distributed: a message to rank ", to, " from rank ", job().rank, " of ", job().size);
  check(tag >= 0 && tag <= job().tag_ub, "distributed: message tag ", tag, " above MPI's limit ", job().tag_ub);
  requests_->requests.push_back(MPI_REQUEST_NULL);
  requests_->peers.push_back(to);
  requests_->receives.push_back(false);
  check_mpi(MPI_Isend(bytes, checked_count(count), MPI_BYTE, to, tag, job().exchange, &requests_->requests.back()),
            "MPI_Isend");
  bytes_sent_ += count;
}

void Exchange::receive(void* bytes, int64_t count, int from, int tag) {
  check(job().mpi && from != job().rank, "distributed: a message from rank ", from, " to rank ", job().rank, " of ",
        job().size);
  requests_->requests.push_back(MPI_REQUEST_NULL);
  requests_->peers.push_back(from);
  requests_->receives.push_back(true);
  check_mpi(MPI_Irecv(bytes, checked_count(count), MPI_BYTE, from, tag, job().exchange, &requests_->requests.back()),
            "MPI_Irecv");
}

bool Exchange::test() {
  if (requests_->requests.empty()) return true;
  int done = 0;
  check_mpi(MPI_Testall(int(requests_->requests.size()), requests_->requests.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall");
  if (done) *requests_ = Requests{};
  return done != 0;
}

void Exchange::wait() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(rank_timeout());
  while (!test()) {
    if (std::chrono::steady_clock::now() > deadline) {
      // The first peer still owed a message; a receive before a send (a send may wait only
      // because its receiver is busy waiting for someone else).
      int missing = -1;
      for (int pass = 0; pass < 2 && missing < 0; ++pass)
        for (size_t i = 0; i < requests_->requests.size(); ++i) {
          if (requests_->receives[i] != (pass == 0) || requests_->requests[i] == MPI_REQUEST_NULL) continue;
          int done = 0;
          check_mpi(MPI_Test(&requests_->requests[i], &done, MPI_STATUS_IGNORE), "MPI_Test");
          if (!done) {
            missing = requests_->peers[i];
            break;
          }
        }
      throw RankTimeout(missing, cat("rank ", missing, " did not arrive within ", rank_timeout(), " s (--rank-timeout)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Exchange::~Exchange() {
  if (!requests_ || requests_->requests.empty()) return;
  if (std::uncaught_exceptions() > 0) return;  // the job is ending; MPI's requests die with it
  try {
    wait();
  } catch (const std::exception&) {
    // a destructor cannot report it; the job ends on the error elsewhere
  }
}
#else
struct Exchange::Requests {};
int max_tag() { return 32766; }
void Exchange::send(const void*, int64_t, int to, int) {
  throw Error(cat("distributed: a message to rank ", to, " in a build without MPI"));
}
void Exchange::receive(void*, int64_t, int from, int) {
  throw Error(cat("distributed: a message from rank ", from, " in a build without MPI"));
}
bool Exchange::test() { return true; }
void Exchange::wait() {}
Exchange::~Exchange() = default;
#endif

Exchange::Exchange() : requests_(std::make_unique<Requests>()) {}
Exchange::Exchange(Exchange&& other) noexcept = default;

// The work queue of for_each_item over ranks: without MPI there is one rank and no queue.
#ifdef ADJOINT_HAVE_MPI
namespace {

// The tags of the work queue's two messages.
constexpr int kAskForItem = 101, kGiveItem = 102;
constexpr int64_t kNoMoreItems = -1;

// ADJOINT_TEST_RANK_DIES_AFTER="r:n": the rank that dies, and after how many finished items
// (for the tests of a sweep that loses a rank); {-1, 0} when unset.
std::pair<int, int64_t> rank_that_dies() {
  const char* hook = std::getenv("ADJOINT_TEST_RANK_DIES_AFTER");
  int dying = -1;
  long long after = 0;
  if (!hook || std::sscanf(hook, "%d:%lld", &dying, &after) != 2) return {-1, 0};
  return {dying, int64_t(after)};
}

// Rank 0's side: answers every other rank's requests with the next item of `next` (shared
// with rank 0's own work loop) until each has been told there are no more.
void hand_out_items(std::atomic<int64_t>& next, int64_t count) {
  for (int waiting = size() - 1; waiting > 0;) {
    int64_t request = 0;
    const int from = receive(&request, 1, any_rank, kAskForItem);
    int64_t item = next.fetch_add(1);
    if (item >= count) item = kNoMoreItems, --waiting;
    send(&item, 1, from, kGiveItem);
  }
}

// Rank 0's side under the test hook: rank 0 takes no item and answers the other ranks in
// turn (1, 2, …, K − 1, 1, 2, …), so that which rank is handed which item does not depend on
// timing: rank r is handed items r − 1, r − 1 + (K − 1), … and a test knows when the dying
// rank is handed the item it dies holding.
void hand_out_items_in_turn(int64_t count) {
  const int workers = size() - 1;
  std::vector<bool> told_no_more(size_t(size()), false);
  int64_t next = 0;
  for (int waiting = workers, r = 1; waiting > 0; r = r % workers + 1) {
    if (told_no_more[size_t(r)]) continue;
    int64_t request = 0;
    receive(&request, 1, r, kAskForItem);
    const int64_t item = next < count ? next++ : kNoMoreItems;
    if (item == kNoMoreItems) told_no_more[size_t(r)] = true, --waiting;
    send(&item, 1, r, kGiveItem);
  }
}

}  // namespace
#endif

void for_each_item(int64_t count, const std::function<void(int64_t item)>& work) {
  if (size() == 1) {
    for (int64_t item = 0; item < count; ++item) work(item);
    return;
  }
#ifdef ADJOINT_HAVE_MPI
  const auto [dying, after] = rank_that_dies();
  int64_t done_here = 0;
  auto do_item = [&](int64_t item) {
    if (rank() == dying && done_here == after) std::raise(SIGKILL);  // dies holding an item, as a lost node
    try {
      work(item);
    } catch (const UsageError& e) {
      abort(2, e.what());
    } catch (const std::exception& e) {
      abort(1, e.what());
    }
    ++done_here;
  };
  if (rank() == 0) {
    std::atomic<int64_t> next{0};
    if (dying > 0) {
      hand_out_items_in_turn(count);  // the test hook: a fixed hand-out
    } else if (job().serialized) {
      std::thread dispatcher([&] {
        try {
          hand_out_items(next, count);
        } catch (const std::exception& e) {
          abort(1, e.what());
        }
      });
      for (int64_t item; (item = next.fetch_add(1)) < count;) do_item(item);
      dispatcher.join();
    } else {
      hand_out_items(next, count);  // MPI for the main thread only: rank 0 just hands out
    }
  } else {
    for (;;) {
      int64_t request = 0, item = 0;
      send(&request, 1, 0, kAskForItem);
      receive(&item, 1, 0, kGiveItem);
      if (item == kNoMoreItems) break;
      do_item(item);
    }
  }
  barrier_quietly();  // every rank's last item is finished
#endif
}

}  // namespace adjoint::distributed
