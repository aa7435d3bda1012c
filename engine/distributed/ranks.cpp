#include "engine/distributed/ranks.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <condition_variable>
#include <limits>
#include <mutex>
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

// The JobOfOne scopes alive: while any is, job() is a job of one.
std::atomic<int> jobs_of_one{0};

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
const Job& whole_job() {
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

// The job as every caller sees it: the whole job, or one of one inside a JobOfOne.
const Job& job() {
  static const Job alone;
  return jobs_of_one > 0 ? alone : whole_job();
}

int checked_count(int64_t count) {
  check(count >= 0 && count <= std::numeric_limits<int>::max(), "distributed: ", count,
        " values in one collective; at most ", std::numeric_limits<int>::max());
  return int(count);
}

// The tags of allgather's and broadcast's messages: above every tag Exchange's callers may
// use (max_tag()).
int gather_tag() { return job().tag_ub; }
int broadcast_tag() { return job().tag_ub - 1; }

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

// broadcast as point-to-point messages under a deadline: the root's bytes to every other
// rank, so that a rank whose root does not arrive names it.
void broadcast_named(void* bytes, int64_t count, int root) {
  check(root >= 0 && root < job().size, "distributed: a broadcast from rank ", root, " in a job of ", job().size);
  Exchange exchange;
  if (job().rank == root) {
    for (int peer = 0; peer < job().size; ++peer)
      if (peer != root) exchange.send(bytes, count, peer, broadcast_tag());
  } else {
    exchange.receive(bytes, count, root, broadcast_tag());
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
const Job& whole_job() {
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
const Job& job() {
  static const Job alone;
  return jobs_of_one > 0 ? alone : whole_job();
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
  broadcast_named(values, count * int64_t(sizeof(float)), root);
}

void broadcast(std::string& text, int root) {
  if (!job().mpi) return;
  int64_t length = int64_t(text.size());
  broadcast_named(&length, int64_t(sizeof length), root);
  text.resize(size_t(length));
  broadcast_named(text.data(), length, root);
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
  std::fprintf(stderr, "rank %d of %d: %s\n", whole_job().rank, whole_job().size, message);
  std::fflush(stderr);
  if (whole_job().mpi) MPI_Abort(MPI_COMM_WORLD, code);
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

void stall_if_asked(int64_t step, const char* point) {
  const char* hook = std::getenv("ADJOINT_TEST_RANK_STALLS_AT");
  int stalling = -1;
  long long at = -1;
  char where[32] = "step";
  if (!hook || std::sscanf(hook, "%d:%lld:%31s", &stalling, &at, where) < 2) return;
  if (stalling == rank() && at == step && std::strcmp(where, point) == 0)
    std::this_thread::sleep_for(std::chrono::hours(1));
}

#ifdef ADJOINT_HAVE_MPI
struct Exchange::Requests {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;  // each request's peer rank
  std::vector<bool> receives;
};

int max_tag() { return job().tag_ub - 2; }

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
int max_tag() { return 32765; }
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

JobOfOne::JobOfOne() { ++jobs_of_one; }
JobOfOne::~JobOfOne() { --jobs_of_one; }

namespace {

constexpr int64_t kNoMoreItems = -1;  // every item is handed out
constexpr int64_t kNoneReady = -2;    // items remain, but each needs one not yet done

// The items of for_each_item and what each needs: rank 0's dispatcher thread and its main
// thread take from it and tell it what is done, so it locks.
class ItemQueue {
public:
  ItemQueue(int64_t count, const std::vector<std::vector<int64_t>>& needs) : needs_(needs), state_(size_t(count), Waiting) {
    check(needs.empty() || int64_t(needs.size()) == count, "distributed: needs for ", needs.size(), " items, not ", count);
    for (size_t i = 0; i < needs.size(); ++i)
      for (int64_t n : needs[i]) check(n >= 0 && n < int64_t(i), "distributed: item ", i, " needs item ", n, ", not an earlier one");
  }
  // The first item in order not yet handed out whose needs are all done (now handed out),
  // kNoneReady, or kNoMoreItems.
  int64_t take() {
    std::lock_guard<std::mutex> hold(mutex_);
    return take_locked();
  }
  // As take, but waits while no item is ready.
  int64_t take_waiting() {
    std::unique_lock<std::mutex> hold(mutex_);
    int64_t item;
    while ((item = take_locked()) == kNoneReady) changed_.wait(hold);
    return item;
  }
  void finish(int64_t item) {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      state_[size_t(item)] = Done;
    }
    changed_.notify_all();
  }

private:
  enum State { Waiting, HandedOut, Done };
  int64_t take_locked() {
    while (first_waiting_ < int64_t(state_.size()) && state_[size_t(first_waiting_)] != Waiting) ++first_waiting_;
    if (first_waiting_ == int64_t(state_.size())) return kNoMoreItems;
    for (int64_t i = first_waiting_; i < int64_t(state_.size()); ++i) {
      if (state_[size_t(i)] != Waiting) continue;
      bool ready = true;
      if (!needs_.empty())
        for (int64_t n : needs_[size_t(i)]) ready = ready && state_[size_t(n)] == Done;
      if (ready) {
        state_[size_t(i)] = HandedOut;
        return i;
      }
    }
    return kNoneReady;
  }
  const std::vector<std::vector<int64_t>>& needs_;
  std::vector<State> state_;
  int64_t first_waiting_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
};

}  // namespace

// The work queue of for_each_item over ranks: without MPI there is one rank and no queue.
#ifdef ADJOINT_HAVE_MPI
namespace {

// The tags of the work queue's two messages: a rank asks with the item it just finished
// (kNoMoreItems: none), and is given an item or kNoMoreItems.
constexpr int kAskForItem = 101, kGiveItem = 102;

// ADJOINT_TEST_RANK_DIES_AFTER="r:n": the rank that dies, and after how many finished items
// (for the tests of a sweep that loses a rank); {-1, 0} when unset.
std::pair<int, int64_t> rank_that_dies() {
  const char* hook = std::getenv("ADJOINT_TEST_RANK_DIES_AFTER");
  int dying = -1;
  long long after = 0;
  if (!hook || std::sscanf(hook, "%d:%lld", &dying, &after) != 2) return {-1, 0};
  return {dying, int64_t(after)};
}

// The work queue's messages, on the whole job even while this process is a job of one to
// the work it runs (JobOfOne).
void give(int64_t item, int to) {
  check_mpi(MPI_Send(&item, 1, MPI_INT64_T, to, kGiveItem, MPI_COMM_WORLD), "MPI_Send");
}

// Rank 0's side: answers every other rank's requests from `queue` (shared with rank 0's own
// work loop) until each has been told there are no more. A rank that asks while no item is
// ready waits, answered once an item it may take is ready.
void hand_out_items(ItemQueue& queue) {
  const int workers = whole_job().size - 1;
  std::vector<int> waiting;  // ranks that asked and have no answer yet
  int told_no_more = 0;
  int64_t asked = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  while (told_no_more < workers) {
    // One request posted at a time, while some rank may still ask.
    if (request == MPI_REQUEST_NULL && told_no_more + int(waiting.size()) < workers)
      check_mpi(MPI_Irecv(&asked, 1, MPI_INT64_T, MPI_ANY_SOURCE, kAskForItem, MPI_COMM_WORLD, &request), "MPI_Irecv");
    bool moved = false;
    if (request != MPI_REQUEST_NULL) {
      int arrived = 0;
      MPI_Status status;
      check_mpi(MPI_Test(&request, &arrived, &status), "MPI_Test");
      if (arrived) {
        if (asked >= 0) queue.finish(asked);
        waiting.push_back(status.MPI_SOURCE);
        moved = true;
      }
    }
    while (!waiting.empty()) {
      const int64_t item = queue.take();
      if (item == kNoneReady) break;
      give(item, waiting.front());
      waiting.erase(waiting.begin());
      told_no_more += item == kNoMoreItems;
      moved = true;
    }
    // Sleeping between looks: a spinning dispatcher would take a core from the ranks' work.
    if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Rank 0's side under the test hook: rank 0 takes no item and answers the other ranks in
// turn (1, 2, …, K − 1, 1, 2, …), so that which rank is handed which item does not depend on
// timing: rank r is handed items r − 1, r − 1 + (K − 1), … and a test knows when the dying
// rank is handed the item it dies holding.
void hand_out_items_in_turn(ItemQueue& queue) {
  const int workers = size() - 1;
  std::vector<bool> told_no_more(size_t(size()), false);
  for (int waiting = workers, r = 1; waiting > 0; r = r % workers + 1) {
    if (told_no_more[size_t(r)]) continue;
    int64_t finished = 0;
    receive(&finished, 1, r, kAskForItem);
    if (finished >= 0) queue.finish(finished);
    const int64_t item = queue.take();
    if (item == kNoMoreItems) told_no_more[size_t(r)] = true, --waiting;
    send(&item, 1, r, kGiveItem);
  }
}

}  // namespace
#endif

void for_each_item(int64_t count, const std::function<void(int64_t item)>& work) { for_each_item(count, {}, work); }

void for_each_item(int64_t count, const std::vector<std::vector<int64_t>>& needs,
                   const std::function<void(int64_t item)>& work) {
  ItemQueue queue(count, needs);
  if (size() == 1) {
    for (int64_t item; (item = queue.take()) != kNoMoreItems;) work(item), queue.finish(item);
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
    if (dying > 0) {
      check(needs.empty(), "distributed: the test hook ADJOINT_TEST_RANK_DIES_AFTER hands out items that need none");
      hand_out_items_in_turn(queue);  // the test hook: a fixed hand-out
    } else if (job().serialized) {
      std::thread dispatcher([&] {
        try {
          hand_out_items(queue);
        } catch (const std::exception& e) {
          abort(1, e.what());
        }
      });
      for (int64_t item; (item = queue.take_waiting()) != kNoMoreItems;) do_item(item), queue.finish(item);
      dispatcher.join();
    } else {
      hand_out_items(queue);  // MPI for the main thread only: rank 0 just hands out
    }
  } else {
    for (int64_t finished = kNoMoreItems;;) {
      int64_t item = 0;
      send(&finished, 1, 0, kAskForItem);
      receive(&item, 1, 0, kGiveItem);
      if (item == kNoMoreItems) break;
      do_item(item);
      finished = item;
    }
  }
  // Every rank's last item is finished. No deadline here: a rank that ran out of items waits
  // for the others' last ones, which may take far longer than any exchange's deadline (a
  // stitch cell trains a stitch). A rank that dies here is named by mpirun, and one whose
  // item fails ends the job itself (abort above).
  barrier_quietly();
#endif
}

}  // namespace adjoint::distributed
