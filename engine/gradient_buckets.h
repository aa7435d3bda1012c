// Adding up the gradients of data-parallel shards (models/training.h, Sharding) in a fixed
// order, with the exchange between processes overlapped with backward, as PyTorch's DDP
// does: the parameters are grouped into buckets of about --bucket-mib MiB, in the order
// backward finishes them (the last layers first), and each bucket's all-gather starts as
// soon as backward has finished every parameter in it, while backward goes on with the
// earlier layers. At the end every bucket's gathered rows are added by the same fixed tree
// over shard indices as a whole-gradient gather would add them: a bucket is a set of
// columns of that sum, and each column sees the same additions in the same order. So the
// bucket size, the order and the timing change nothing in the result, bit for bit.
#pragma once
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/distributed.h"
#include "engine/tensor.h"

namespace adjoint {

// Sums `count` rows of `length` values into row 0, in place, by the fixed pairwise tree over
// row indices: for width 1, 2, 4, …: row i += row i + width for every i that is a multiple of
// 2·width. A block of rows whose size is a power of two and whose first index is a multiple
// of it is a subtree: summed first, it leaves the tree's result unchanged.
void tree_sum_rows(float* rows, int64_t count, int64_t length);
void tree_sum_rows(double* rows, int64_t count, int64_t length);

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

  // Starts the buckets not started yet (in bucket order, as every rank does), waits for all
  // and adds each bucket's rows by the tree over shard indices. Returns the sums of every
  // tensor, one after another in index order. Call once, after every add().
  std::vector<float> finish();

  int64_t buckets() const { return int64_t(buckets_.size()); }
  // Buckets whose all-gather add() started, before finish(): read right after backward
  // returns, those whose exchange overlapped with it.
  int64_t started_early() const { return started_early_; }
  // The tensor indices in the order they became final here (every shard added): the order
  // for the next step's buckets.
  const std::vector<int64_t>& ready_order() const { return ready_order_; }

private:
  struct Bucket {
    std::vector<int64_t> members;  // tensor indices
    int64_t length = 0;            // values per row
    int64_t waiting_for = 0;       // members not final yet
    std::vector<float> rows;       // shards_here rows: this process's shards, in shard order
    std::vector<float> gathered;   // every rank's rows, in rank order: all shards in shard order
    distributed::PendingGather gather;
  };
  // Starts bucket `next_to_start_` and those after it while they are ready (main thread).
  void start_ready_buckets(std::unique_lock<std::mutex>& lock);
  void start(Bucket& bucket);

  std::vector<int64_t> sizes_;
  int64_t shards_here_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_, offset_in_bucket_;  // per tensor
  std::vector<int64_t> shards_done_;                   // per tensor: local shards added
  std::vector<int64_t> ready_order_;
  size_t next_to_start_ = 0;
  int64_t started_early_ = 0;
  std::thread::id main_thread_;
  std::mutex mutex_;
};

}  // namespace adjoint
