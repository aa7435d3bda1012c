#include "engine/distributed/gradient_buckets.h"

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

std::vector<Subtree> rank_subtrees(int64_t shards, int64_t ranks) {
  check(shards >= 1 && ranks >= 1 && shards % ranks == 0, "gradient buckets: ", shards, " shards over ", ranks, " ranks");
  const int64_t block = shards / ranks;
  std::vector<Subtree> out;
  // The node of the tree that starts at `first` and spans up to `width` shards.
  auto visit = [&](auto&& self, int64_t first, int64_t width) -> void {
    const int64_t last = std::min(first + width, shards) - 1;
    if (first / block == last / block) {
      out.push_back({first, last - first + 1});
      return;
    }
    self(self, first, width / 2);
    if (first + width / 2 < shards) self(self, first + width / 2, width / 2);
  };
  int64_t root = 1;
  while (root < shards) root *= 2;
  visit(visit, 0, root);
  return out;
}

void tree_sum_subtrees(float* rows, const std::vector<Subtree>& subtrees, int64_t shards, int64_t length) {
  size_t next = 0;  // the subtrees are met in shard order
  // Sums the node starting at `first` spanning up to `width` shards into the row of its
  // first subtree, and returns that row.
  auto visit = [&](auto&& self, int64_t first, int64_t width) -> float* {
    check(next < subtrees.size() && subtrees[next].first >= first, "gradient buckets: subtrees that do not cover the shards");
    if (subtrees[next].first == first && subtrees[next].count == std::min(width, shards - first))
      return rows + int64_t(next++) * length;
    float* left = self(self, first, width / 2);
    if (first + width / 2 < shards) {
      const float* right = self(self, first + width / 2, width / 2);
      for (int64_t k = 0; k < length; ++k) left[k] += right[k];
    }
    return left;
  };
  int64_t root = 1;
  while (root < shards) root *= 2;
  visit(visit, 0, root);
  check(next == subtrees.size(), "gradient buckets: ", subtrees.size() - next, " subtrees left over");
}

Slice slice_of(int64_t length, int64_t ranks, int64_t rank) {
  const int64_t first = rank * length / ranks;
  return {first, (rank + 1) * length / ranks - first};
}

ExchangeCounts exchange_formula(int64_t shards, int64_t ranks, int64_t rank, int64_t length) {
  const std::vector<Subtree> subtrees = rank_subtrees(shards, ranks);
  const int64_t block = shards / ranks, all = int64_t(subtrees.size());
  const int64_t here = std::count_if(subtrees.begin(), subtrees.end(), [&](const Subtree& t) { return t.first / block == rank; });
  const int64_t slice = slice_of(length, ranks, rank).count;
  ExchangeCounts c;
  c.bytes_sent = int64_t(sizeof(float)) * (here * (length - slice) + (ranks - 1) * slice);
  c.receive_bytes = int64_t(sizeof(float)) * (all * slice + length);
  c.additions = (block - here) * length + (all - 1) * slice;
  return c;
}

BucketedSum::BucketedSum(std::vector<int64_t> sizes, const std::vector<int64_t>& order, int64_t shards_here,
                         double bucket_mib)
    : sizes_(std::move(sizes)),
      shards_here_(shards_here),
      ranks_(distributed::size()),
      rank_(distributed::rank()),
      main_thread_(std::this_thread::get_id()) {
  const size_t count = sizes_.size();
  check(shards_here_ >= 1, "gradient buckets: ", shards_here_, " shards in this process");
  check(order.size() == count, "gradient buckets: an order of ", order.size(), " tensors for ", count);
  subtrees_ = rank_subtrees(shards_here_ * ranks_, ranks_);
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
  // Two tags per bucket (its scatter and its gather), so that buckets may start in any order.
  check(2 * int64_t(buckets_.size()) - 1 <= distributed::max_tag(), "gradient buckets: ", buckets_.size(),
        " buckets need more message tags than MPI has (", distributed::max_tag(), "); give a larger --bucket-mib");
  ready_order_.reserve(count);
}

void BucketedSum::add(int64_t shard, int64_t index, const Tensor& values) {
  check(shard >= 0 && shard < shards_here_ && index >= 0 && size_t(index) < sizes_.size(),
        "gradient buckets: shard ", shard, " of ", shards_here_, ", tensor ", index, " of ", sizes_.size());
  check(values.numel() == sizes_[size_t(index)], "gradient buckets: tensor ", index, " has ", values.numel(),
        " values, expected ", sizes_[size_t(index)]);
  const int64_t b = bucket_of_[size_t(index)];
  Bucket& bucket = buckets_[size_t(b)];
  // Each (shard, tensor) owns its place in the rows: written without the lock.
  copy_to_dense(values, bucket.rows.data() + shard * bucket.length + offset_in_bucket_[size_t(index)]);
  {
    std::lock_guard lock(mutex_);
    check(shards_done_[size_t(index)] < shards_here_, "gradient buckets: tensor ", index, " added twice for a shard");
    if (++shards_done_[size_t(index)] == shards_here_) {
      ready_order_.push_back(index);
      if (--bucket.waiting_for == 0) ready_buckets_.push_back(b);
    }
  }
  if (std::this_thread::get_id() == main_thread_) {
    started_early_ += start_ready_buckets();
    move_on();
  }
}

int64_t BucketedSum::start_ready_buckets() {
  std::vector<int64_t> ready;
  {
    std::lock_guard lock(mutex_);
    ready.swap(ready_buckets_);
  }
  for (int64_t b : ready) scatter(b);
  return int64_t(ready.size());
}

void BucketedSum::scatter(int64_t b) {
  Bucket& bucket = buckets_[size_t(b)];
  const int64_t length = bucket.length, block = shards_here_, first_here = rank_ * block;
  const Slice mine = slice_of(length, ranks_, rank_);
  bucket.slice_rows.assign(subtrees_.size() * size_t(mine.count), 0.0f);
  for (size_t t = 0; t < subtrees_.size(); ++t) {
    const Subtree& subtree = subtrees_[t];
    const int64_t owner = subtree.first / block;
    if (owner == rank_) {
      // This rank's subtree: summed here, its slice kept, the others' slices sent.
      float* partial = bucket.rows.data() + (subtree.first - first_here) * length;
      tree_sum_rows(partial, subtree.count, length);
      counts_.additions += (subtree.count - 1) * length;
      std::copy(partial + mine.first, partial + mine.first + mine.count, bucket.slice_rows.begin() + int64_t(t) * mine.count);
      for (int64_t peer = 0; peer < ranks_; ++peer) {
        if (peer == rank_) continue;
        const Slice theirs = slice_of(length, ranks_, peer);
        bucket.scatter.send_values(partial + theirs.first, theirs.count, int(peer), int(2 * b));
      }
    } else {
      bucket.scatter.receive_values(bucket.slice_rows.data() + int64_t(t) * mine.count, mine.count, int(owner), int(2 * b));
    }
  }
  counts_.receive_bytes += int64_t(sizeof(float)) * (int64_t(bucket.slice_rows.size()) + length);
  bucket.phase = Phase::Scattering;
}

void BucketedSum::gather(int64_t b) {
  Bucket& bucket = buckets_[size_t(b)];
  const Slice mine = slice_of(bucket.length, ranks_, rank_);
  tree_sum_subtrees(bucket.slice_rows.data(), subtrees_, shards_here_ * ranks_, mine.count);
  counts_.additions += (int64_t(subtrees_.size()) - 1) * mine.count;
  bucket.sum.assign(size_t(bucket.length), 0.0f);
  std::copy(bucket.slice_rows.begin(), bucket.slice_rows.begin() + mine.count, bucket.sum.begin() + mine.first);
  bucket.slice_rows = {};
  bucket.rows = {};
  for (int64_t peer = 0; peer < ranks_; ++peer) {
    if (peer == rank_) continue;
    const Slice theirs = slice_of(bucket.length, ranks_, peer);
    bucket.gather.send_values(bucket.sum.data() + mine.first, mine.count, int(peer), int(2 * b + 1));
    bucket.gather.receive_values(bucket.sum.data() + theirs.first, theirs.count, int(peer), int(2 * b + 1));
  }
  bucket.phase = Phase::Gathering;
}

void BucketedSum::move_on() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.phase == Phase::Scattering && bucket.scatter.test()) gather(int64_t(b));
    if (bucket.phase == Phase::Gathering && bucket.gather.test()) bucket.phase = Phase::Done;
  }
}

std::vector<float> BucketedSum::finish() {
  check(std::this_thread::get_id() == main_thread_, "gradient buckets: finish() off the thread that may call MPI");
  start_ready_buckets();
  for (size_t b = 0; b < buckets_.size(); ++b)  // those never filled (a diverged shard's)
    if (buckets_[b].phase == Phase::Filling) scatter(int64_t(b));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.phase == Phase::Scattering) {
      bucket.scatter.wait();
      gather(int64_t(b));
    }
    move_on();  // the later buckets' scatters go on meanwhile
  }
  std::vector<int64_t> first_of(sizes_.size() + 1, 0);  // each tensor's place in the result
  for (size_t i = 0; i < sizes_.size(); ++i) first_of[i + 1] = first_of[i] + sizes_[i];
  std::vector<float> sums(size_t(first_of.back()));
  for (Bucket& bucket : buckets_) {
    bucket.gather.wait();
    bucket.phase = Phase::Done;
    counts_.bytes_sent += bucket.scatter.bytes_sent() + bucket.gather.bytes_sent();
    for (size_t m = 0; m < bucket.members.size(); ++m) {
      const int64_t index = bucket.members[m];
      const float* from = bucket.sum.data() + offset_in_bucket_[size_t(index)];
      std::copy(from, from + sizes_[size_t(index)], sums.begin() + first_of[size_t(index)]);
    }
  }
  return sums;
}

}  // namespace adjoint
