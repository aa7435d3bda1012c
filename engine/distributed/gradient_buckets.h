// Adding up the gradients of data-parallel shards (models/training.h, Sharding) in a fixed
// order, with the exchange between processes overlapped with backward, as PyTorch's DDP
// does: the parameters are grouped into buckets of about --bucket-mib MiB, in the order
// backward finishes them (the last layers first), and each bucket's exchange starts as soon
// as backward has finished every parameter in it, while backward goes on with the earlier
// layers.
//
// The exchange is a reduce-scatter then an all-gather, as a ring all-reduce's, but with the
// fixed tree over shard indices as the order of the additions. Each rank owns a contiguous
// slice of every bucket's columns. It first sums its own shards along the tree where the
// tree's subtrees lie inside its block of shards (rank_subtrees), sends each other rank
// those partial sums of that rank's slice, adds the partials it receives for its own slice
// by the rest of the tree (tree_sum_subtrees), and sends its summed slice to every other
// rank. Every column sees the same additions in the same order as tree_sum_rows over all
// the shards in one process, so neither K, nor the bucket size, nor the timing changes a
// bit. Per rank and bucket of L values, with N subtrees in all and n of them on this rank
// (N = K and n = 1 when S/K is a power of two): n·(L − L/K) + (K − 1)·L/K values sent
// (2(K − 1)/K · L, the ring's), N·L/K + L values of receive buffers, and
// (S/K − n)·L + (N − 1)·L/K additions (this rank's shards, then its slice of the rest).
#pragma once
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/distributed/ranks.h"
#include "engine/tensor.h"

namespace adjoint {

// Sums `count` rows of `length` values into row 0, in place, by the fixed pairwise tree over
// row indices: for width 1, 2, 4, …: row i += row i + width for every i that is a multiple of
// 2·width. A block of rows whose size is a power of two and whose first index is a multiple
// of it is a subtree: summed first, it leaves the tree's result unchanged.
void tree_sum_rows(float* rows, int64_t count, int64_t length);
void tree_sum_rows(double* rows, int64_t count, int64_t length);

// A subtree of the tree over shard indices: shards first … first + count − 1.
struct Subtree {
  int64_t first = 0, count = 0;
  bool operator==(const Subtree&) const = default;
};

// The largest subtrees of the tree over `shards` indices that lie inside one rank's block
// when each of `ranks` ranks holds shards/ranks consecutive shards, in shard order: they
// cover every shard once. When the block size is a power of two, each block is one subtree.
std::vector<Subtree> rank_subtrees(int64_t shards, int64_t ranks);

// `rows` holds one row of `length` values per subtree of `subtrees` (rank_subtrees, in
// order), each its subtree's tree sum; adds them into row 0 by the rest of the tree over
// `shards`: the bits of tree_sum_rows over every shard's row.
void tree_sum_subtrees(float* rows, const std::vector<Subtree>& subtrees, int64_t shards, int64_t length);

// Rank `rank`'s slice of a bucket of `length` values when `ranks` ranks share it:
// columns first … first + count − 1, the slices in rank order, their sizes differing by at
// most one.
struct Slice {
  int64_t first = 0, count = 0;
};
Slice slice_of(int64_t length, int64_t ranks, int64_t rank);

// What one rank's exchange of one step cost: bytes handed to MPI to send, bytes of buffers
// allocated to receive into (the partials for its slice and the gathered sum), and float
// additions.
struct ExchangeCounts {
  int64_t bytes_sent = 0, receive_bytes = 0, additions = 0;
  ExchangeCounts& operator+=(const ExchangeCounts& o) {
    bytes_sent += o.bytes_sent, receive_bytes += o.receive_bytes, additions += o.additions;
    return *this;
  }
  bool operator==(const ExchangeCounts&) const = default;
};
// The same counts from the formulas above, for one bucket of `length` values.
ExchangeCounts exchange_formula(int64_t shards, int64_t ranks, int64_t rank, int64_t length);

// PyTorch DDP's default bucket size.
constexpr double default_bucket_mib = 25.0;

// `order` (tensor indices) cut into consecutive buckets: a bucket closes once it holds at
// least `bucket_mib` MiB of float values (sizes[i] values each), so every bucket but the last
// reaches the size, and a tensor larger than it is a bucket of its own.
std::vector<std::vector<int64_t>> plan_buckets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order,
                                               double bucket_mib);

// The sum over every shard of the job of a list of tensors (the gradients, then the running
// statistics), each shard's values given tensor by tensor as they become final.
// This process computes `shards_here` consecutive shards (S/K of S, rank r's block); the
// sum is over all S. Construct, add() every tensor of every local shard, then finish().
//
// Threads: add() may be called from any thread (shards computed at once). MPI is called
// only from the thread that constructed the object (the main thread): an add() there starts
// the ready buckets and lets MPI move the started ones on; buckets made ready by other
// threads wait for the next add() on the main thread, or for finish().
class BucketedSum {
public:
  // `sizes`: the value count of every tensor; `order`: every tensor index once, in the
  // order backward is expected to finish them (it sets the buckets, not the result).
  BucketedSum(std::vector<int64_t> sizes, const std::vector<int64_t>& order, int64_t shards_here, double bucket_mib);
  BucketedSum(const BucketedSum&) = delete;
  BucketedSum& operator=(const BucketedSum&) = delete;

  // Local shard `shard`'s (0 … shards_here − 1) final values of tensor `index`.
  void add(int64_t shard, int64_t index, const Tensor& values);

  // Starts the buckets not started yet, waits for all (throwing distributed::RankTimeout
  // naming a rank that does not send its part in time) and returns the sums of every
  // tensor, one after another in index order. Call once, after every add().
  std::vector<float> finish();

  int64_t buckets() const { return int64_t(buckets_.size()); }
  // Buckets whose exchange add() started, before finish(): read right after backward
  // returns, those whose exchange overlapped with it.
  int64_t started_early() const { return started_early_; }
  // The tensor indices in the order they became final here (every shard added): the order
  // for the next step's buckets.
  const std::vector<int64_t>& ready_order() const { return ready_order_; }
  // What this rank's exchange cost, over every bucket (complete after finish()).
  const ExchangeCounts& counts() const { return counts_; }

private:
  enum class Phase { Filling, Scattering, Gathering, Done };
  struct Bucket {
    std::vector<int64_t> members;  // tensor indices
    int64_t length = 0;            // values per row
    int64_t waiting_for = 0;       // members not final yet
    Phase phase = Phase::Filling;
    std::vector<float> rows;        // shards_here rows: this process's shards, in shard order
    std::vector<float> slice_rows;  // every subtree's partial sum of this rank's slice
    std::vector<float> sum;         // the summed bucket, every rank's slice gathered
    distributed::Exchange scatter, gather;
  };
  // Starts the buckets made ready so far (main thread) and returns how many.
  int64_t start_ready_buckets();
  void scatter(int64_t b);  // sums this rank's subtrees, sends their partials of every slice
  void gather(int64_t b);   // sums this rank's slice by the tree, sends it to every rank
  void move_on();           // lets MPI move the started buckets on, gathering those scattered

  std::vector<int64_t> sizes_;
  int64_t shards_here_, ranks_, rank_;
  std::vector<Subtree> subtrees_;  // of every rank, in shard order
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_, offset_in_bucket_;  // per tensor
  std::vector<int64_t> shards_done_;                   // per tensor: local shards added
  std::vector<int64_t> ready_order_;
  std::vector<int64_t> ready_buckets_;  // filled, not started yet
  int64_t started_early_ = 0;
  ExchangeCounts counts_;
  std::thread::id main_thread_;
  std::mutex mutex_;
};

}  // namespace adjoint
