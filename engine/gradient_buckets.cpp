#include "engine/gradient_buckets.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

template <class T>
void tree_sum(T* rows, int64_t count, int64_t length) {
  for (int64_t width = 1; width < count; width *= 2)
    for (int64_t i = 0; i + width < count; i += 2 * width) {
      T* into = rows + i * length;
      const T* from = rows + (i + width) * length;
      for (int64_t k = 0; k < length; ++k) into[k] += from[k];
    }
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

void tree_sum_rows(float* rows, int64_t count, int64_t length) { tree_sum(rows, count, length); }
void tree_sum_rows(double* rows, int64_t count, int64_t length) { tree_sum(rows, count, length); }

std::vector<std::vector<int64_t>> plan_buckets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& order,
                                               double bucket_mib) {
  check(bucket_mib > 0 && std::isfinite(bucket_mib), "gradient buckets: the bucket size must be a positive number of MiB, got ",
        bucket_mib);
  const double bucket_bytes = bucket_mib * 1024 * 1024;
  std::vector<std::vector<int64_t>> buckets;
  std::vector<int64_t> current;
  double bytes = 0;
  for (int64_t index : order) {
    current.push_back(index);
    bytes += double(sizes.at(size_t(index))) * sizeof(float);
    if (bytes >= bucket_bytes) {
      buckets.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

BucketedSum::BucketedSum(std::vector<int64_t> sizes, const std::vector<int64_t>& order, int64_t shards_here,
                         double bucket_mib)
    : sizes_(std::move(sizes)), shards_here_(shards_here), main_thread_(std::this_thread::get_id()) {
  const size_t count = sizes_.size();
  check(shards_here_ >= 1, "gradient buckets: ", shards_here_, " shards in this process");
  check(order.size() == count, "gradient buckets: an order of ", order.size(), " tensors for ", count);
  bucket_of_.assign(count, -1);
  offset_in_bucket_.assign(count, 0);
  shards_done_.assign(count, 0);
  for (std::vector<int64_t>& members : plan_buckets(sizes_, order, bucket_mib)) {
    Bucket bucket;
    for (int64_t index : members) {
      check(index >= 0 && size_t(index) < count && bucket_of_[size_t(index)] < 0,
            "gradient buckets: the order names tensor ", index, " twice or out of range");
      bucket_of_[size_t(index)] = int64_t(buckets_.size());
      offset_in_bucket_[size_t(index)] = bucket.length;
      bucket.length += sizes_[size_t(index)];
    }
    bucket.members = std::move(members);
    bucket.waiting_for = int64_t(bucket.members.size());
    bucket.rows.assign(size_t(shards_here_ * bucket.length), 0.0f);  // a shard whose loss diverged adds nothing
    buckets_.push_back(std::move(bucket));
  }
  ready_order_.reserve(count);
}

void BucketedSum::add(int64_t shard, int64_t index, const Tensor& values) {
  check(shard >= 0 && shard < shards_here_ && index >= 0 && size_t(index) < sizes_.size(),
        "gradient buckets: shard ", shard, " of ", shards_here_, ", tensor ", index, " of ", sizes_.size());
  check(values.numel() == sizes_[size_t(index)], "gradient buckets: tensor ", index, " has ", values.numel(),
        " values, expected ", sizes_[size_t(index)]);
  Bucket& bucket = buckets_[size_t(bucket_of_[size_t(index)])];
  // Each (shard, tensor) owns its place in the rows: written without the lock.
  copy_to_dense(values, bucket.rows.data() + shard * bucket.length + offset_in_bucket_[size_t(index)]);
  std::unique_lock lock(mutex_);
  check(shards_done_[size_t(index)] < shards_here_, "gradient buckets: tensor ", index, " added twice for a shard");
  if (++shards_done_[size_t(index)] == shards_here_) {
    ready_order_.push_back(index);
    --bucket.waiting_for;
  }
  if (std::this_thread::get_id() == main_thread_) start_ready_buckets(lock);
}

void BucketedSum::start_ready_buckets(std::unique_lock<std::mutex>&) {
  // In bucket order only: every rank must start the same collectives in the same order.
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].waiting_for == 0) {
    start(buckets_[next_to_start_++]);
    ++started_early_;
  }
  for (size_t b = 0; b < next_to_start_; ++b) buckets_[b].gather.test();  // MPI moves them on only when called
}

void BucketedSum::start(Bucket& bucket) {
  // When this process's shards are a power of two, they form a subtree of the tree over
  // shard indices: summed here first, one row goes out instead of shards_here_ (the same
  // additions in the same order, less to send).
  const int64_t rows_sent = is_power_of_two(shards_here_) ? 1 : shards_here_;
  if (rows_sent == 1) tree_sum_rows(bucket.rows.data(), shards_here_, bucket.length);
  bucket.gathered.assign(size_t(distributed::size() * rows_sent * bucket.length), 0.0f);
  bucket.gather = distributed::start_allgather(bucket.rows.data(), rows_sent * bucket.length, bucket.gathered.data());
}

std::vector<float> BucketedSum::finish() {
  check(std::this_thread::get_id() == main_thread_, "gradient buckets: finish() off the thread that may call MPI");
  {
    std::lock_guard lock(mutex_);
    for (; next_to_start_ < buckets_.size(); ++next_to_start_) start(buckets_[next_to_start_]);
  }
  std::vector<int64_t> first_of(sizes_.size() + 1, 0);  // each tensor's place in the result
  for (size_t i = 0; i < sizes_.size(); ++i) first_of[i + 1] = first_of[i] + sizes_[i];
  std::vector<float> sums(size_t(first_of.back()));
  const int64_t rows_sent = is_power_of_two(shards_here_) ? 1 : shards_here_;
  for (Bucket& bucket : buckets_) {
    bucket.gather.wait();
    tree_sum_rows(bucket.gathered.data(), distributed::size() * rows_sent, bucket.length);
    for (size_t m = 0; m < bucket.members.size(); ++m) {
      const int64_t index = bucket.members[m];
      const float* from = bucket.gathered.data() + offset_in_bucket_[size_t(index)];
      std::copy(from, from + sizes_[size_t(index)], sums.begin() + first_of[size_t(index)]);
    }
  }
  return sums;
}

}  // namespace adjoint
