// Gradients summed in buckets while backward runs (engine/distributed/gradient_buckets.h): the bucket
// size, the expected order and the order of arrival change no bit of the sum, and the
// sharded training step gives the bits of the whole-gradient tree sum it replaced.
#include <doctest/doctest.h>

#include <algorithm>

#include "engine/autograd.h"
#include "engine/distributed/gradient_buckets.h"
#include "engine/random.h"
#include "models/training.h"
#include "tests/support.h"
#include "ops/layout.h"
#include "ops/loss.h"

using namespace adjoint;
using adjoint::testing::grey_resnet18;
using adjoint::testing::random_grey_batch;

namespace {

// Values whose float sum depends on the order of the additions: every shard's first value
// of every tensor is ±1e8, so a sum in another order loses the small parts differently.
std::vector<Tensor> shard_values(const std::vector<int64_t>& sizes, int64_t shard) {
  Generator gen(uint64_t(100 + shard));
  std::vector<Tensor> out;
  for (int64_t size : sizes) {
    std::vector<float> v = normal({size}, 0.0f, 1.0f, gen).to_vector();
    v[0] = (shard % 2 ? -1.0f : 1.0f) * 1e8f + float(shard);
    out.push_back(Tensor::from_vector({size}, v));
  }
  return out;
}

}  // namespace

TEST_CASE("gradient buckets: a bucket closes once it reaches the size; a larger tensor is a bucket of its own") {
  const std::vector<int64_t> sizes = {100, 300, 50, 20, 1000};  // floats: 400, 1200, 200, 80, 4000 bytes
  const double kib = 1.0 / 1024;                                 // one KiB in MiB
  CHECK(plan_buckets(sizes, {4, 3, 2, 1, 0}, kib) == std::vector<std::vector<int64_t>>{{4}, {3, 2, 1}, {0}});
  CHECK(plan_buckets(sizes, {0, 1, 2, 3, 4}, 25) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3, 4}});
  CHECK_THROWS(plan_buckets(sizes, {0}, 0.0));
}

TEST_CASE("gradient buckets: any bucket size, expected order and arrival order give the bits of the tree sum") {
  const std::vector<int64_t> sizes = {300, 7, 1000, 64, 513, 1};
  for (int64_t shards : {4, 6}) {  // a power of two (summed here first) and not
    CAPTURE(shards);
    // The sum of before: every shard's tensors one after another in a row, rows added by
    // the tree over shard indices.
    int64_t length = 0;
    for (int64_t s : sizes) length += s;
    std::vector<float> rows;
    for (int64_t j = 0; j < shards; ++j)
      for (const Tensor& t : shard_values(sizes, j)) {
        const std::vector<float> v = t.to_vector();
        rows.insert(rows.end(), v.begin(), v.end());
      }
    tree_sum_rows(rows.data(), shards, length);
    rows.resize(size_t(length));
    std::vector<float> left_to_right(size_t(length), 0.0f);  // what a sum in arrival order would give
    for (int64_t j = 0; j < shards; ++j) {
      int64_t at = 0;
      for (const Tensor& t : shard_values(sizes, j))
        for (float v : t.to_vector()) left_to_right[size_t(at++)] += v;
    }
    REQUIRE(left_to_right != rows);  // the values can tell the orders apart

    const std::vector<std::vector<int64_t>> orders = {{5, 4, 3, 2, 1, 0}, {2, 0, 5, 1, 4, 3}};
    for (double mib : {0.001, 0.002, 1.0, 25.0})
      for (const std::vector<int64_t>& order : orders) {
        CAPTURE(mib);
        BucketedSum sum(sizes, order, shards, mib);
        // Shards last to first, each tensor in the expected order: every tensor is final at
        // the first shard's add, and the buckets start as they fill up.
        for (int64_t j = shards; j-- > 0;) {
          const std::vector<Tensor> values = shard_values(sizes, j);
          for (int64_t index : order) sum.add(j, index, values[size_t(index)]);
        }
        CHECK(sum.ready_order() == order);
        CHECK(sum.started_early() == sum.buckets());  // a job of one starts (copies) each bucket when it is ready
        CHECK(sum.finish() == rows);
        if (mib < 0.01) CHECK(sum.buckets() > 2);
        if (mib > 1) CHECK(sum.buckets() == 1);
      }
  }
}

TEST_CASE("reduce-scatter along the shard tree: the subtrees inside the ranks' blocks, summed by the rest of the "
          "tree slice by slice, give the bits of the whole tree at every K dividing S; the ring's cost") {
  // The blocks: a power of two is one subtree each; otherwise the largest aligned pieces.
  CHECK(rank_subtrees(8, 4) == std::vector<Subtree>{{0, 2}, {2, 2}, {4, 2}, {6, 2}});
  CHECK(rank_subtrees(6, 3) == std::vector<Subtree>{{0, 2}, {2, 2}, {4, 2}});
  CHECK(rank_subtrees(6, 2) == std::vector<Subtree>{{0, 2}, {2, 1}, {3, 1}, {4, 2}});
  CHECK(rank_subtrees(6, 1) == std::vector<Subtree>{{0, 6}});
  CHECK(rank_subtrees(12, 3) == std::vector<Subtree>{{0, 4}, {4, 4}, {8, 4}});

  const int64_t length = 1001;  // not a multiple of any K: slices of unequal sizes
  for (int64_t shards : {8, 6, 12, 24}) {
    std::vector<float> rows;
    for (int64_t j = 0; j < shards; ++j) {
      const std::vector<float> v = shard_values({length}, j)[0].to_vector();
      rows.insert(rows.end(), v.begin(), v.end());
    }
    std::vector<float> whole = rows;
    tree_sum_rows(whole.data(), shards, length);
    whole.resize(size_t(length));
    std::vector<float> left_to_right(static_cast<size_t>(length), 0.0f);
    for (int64_t j = 0; j < shards; ++j)
      for (int64_t k = 0; k < length; ++k) left_to_right[size_t(k)] += rows[size_t(j * length + k)];
    REQUIRE(left_to_right != whole);
    for (int64_t ranks = 1; ranks <= shards; ++ranks) {
      if (shards % ranks != 0) continue;
      CAPTURE(shards);
      CAPTURE(ranks);
      const int64_t block = shards / ranks;
      const std::vector<Subtree> subtrees = rank_subtrees(shards, ranks);
      // Every rank sums its own subtrees over the whole bucket, as BucketedSum::scatter does.
      std::vector<float> partials(subtrees.size() * size_t(length));
      std::vector<ExchangeCounts> counted(static_cast<size_t>(ranks));
      for (size_t t = 0; t < subtrees.size(); ++t) {
        const Subtree& st = subtrees[t];
        REQUIRE(st.first / block == (st.first + st.count - 1) / block);  // inside one block
        std::vector<float> mine(rows.begin() + st.first * length, rows.begin() + (st.first + st.count) * length);
        tree_sum_rows(mine.data(), st.count, length);
        std::copy(mine.begin(), mine.begin() + length, partials.begin() + int64_t(t) * length);
        counted[size_t(st.first / block)].additions += (st.count - 1) * length;
      }
      // Each owner adds every subtree's partial of its slice; the slices side by side.
      std::vector<float> gathered(static_cast<size_t>(length));
      int64_t covered = 0;
      for (int64_t r = 0; r < ranks; ++r) {
        const Slice slice = slice_of(length, ranks, r);
        CHECK(slice.first == covered);
        covered += slice.count;
        std::vector<float> slice_rows;
        for (size_t t = 0; t < subtrees.size(); ++t) {
          const float* p = partials.data() + int64_t(t) * length + slice.first;
          slice_rows.insert(slice_rows.end(), p, p + slice.count);
          const int64_t owner = subtrees[t].first / block;
          if (owner != r) counted[size_t(owner)].bytes_sent += 4 * slice.count;  // a partial sent to r
        }
        tree_sum_subtrees(slice_rows.data(), subtrees, shards, slice.count);
        std::copy(slice_rows.begin(), slice_rows.begin() + slice.count, gathered.begin() + slice.first);
        counted[size_t(r)].additions += (int64_t(subtrees.size()) - 1) * slice.count;
        counted[size_t(r)].bytes_sent += 4 * (ranks - 1) * slice.count;  // the summed slice to every other rank
        counted[size_t(r)].receive_bytes += 4 * (int64_t(subtrees.size()) * slice.count + length);
      }
      CHECK(covered == length);
      CHECK(gathered == whole);
      const double bytes = 4.0 * double(length);
      for (int64_t r = 0; r < ranks; ++r) {
        CAPTURE(r);
        CHECK(counted[size_t(r)] == exchange_formula(shards, ranks, r, length));
        CHECK(counted[size_t(r)].receive_bytes <= int64_t(4 * (int64_t(subtrees.size()) * (length / ranks + 1) + length)));
        if ((block & (block - 1)) == 0) {  // one subtree per rank: the ring's cost
          CHECK(double(counted[size_t(r)].bytes_sent) <= 2.0 * double(ranks - 1) / double(ranks) * bytes + 8.0 * ranks);
          CHECK(counted[size_t(r)].additions <= (block - 1) * length + (ranks - 1) * (length / ranks + 1));
        }
      }
    }
  }
}

namespace {

std::shared_ptr<Model> fresh_model(const ModelConfig& c) {
  Generator gen(11);
  auto model = make_model(c, gen);
  model->train(true);
  return model;
}

// The parameters' gradients, then the running statistics, one after another.
std::vector<float> gradients_and_statistics(const Model& m) {
  std::vector<float> out;
  for (const Tensor& p : m.parameters()) {
    const std::vector<float> g = p.grad().to_vector();
    out.insert(out.end(), g.begin(), g.end());
  }
  for (const auto& [name, b] : m.named_buffers()) {
    const std::vector<float> v = b.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("training step: the bucket size changes no bit; the sum is the whole-gradient tree sum of before") {
  const ModelConfig c = grey_resnet18(0.0625, 8, 3);
  const Batch batch = random_grey_batch(16, 8, 3, 7);

  // The step of before, written out: each shard's weighted gradient and updated running
  // statistics in one row, the 4 rows added by the tree over shard indices, the statistics
  // divided by 4.
  std::vector<float> before;
  {
    auto model = fresh_model(c);
    const std::vector<Tensor> params = model->parameters();
    std::vector<float> start;
    for (const auto& [name, b] : model->named_buffers()) {
      const std::vector<float> v = b.to_vector();
      start.insert(start.end(), v.begin(), v.end());
    }
    std::vector<float> rows;
    int64_t gradient_length = 0;
    for (int64_t s = 0; s < 4; ++s) {
      int64_t at = 0;
      for (auto& [name, b] : model->named_buffers()) {  // every shard from the step's starting statistics
        Tensor handle = b;
        std::copy(start.begin() + at, start.begin() + at + handle.numel(), handle.data());
        at += handle.numel();
      }
      Tensor part = slice(batch.inputs, 0, 4 * s, 4 * s + 4).contiguous();
      const std::vector<int64_t> labels(batch.labels.begin() + 4 * s, batch.labels.begin() + 4 * s + 4);
      GradientOnly training_graph;
      Tensor loss = cross_entropy(model->forward(part), labels, 0.0f);
      const std::vector<Tensor> grads = grad(loss, params, Tensor::full(loss.shape(), 0.25f), {}, false);
      gradient_length = 0;
      for (const Tensor& g : grads) {
        const std::vector<float> v = g.to_vector();
        rows.insert(rows.end(), v.begin(), v.end());
        gradient_length += g.numel();
      }
      for (const auto& [name, b] : model->named_buffers()) {
        const std::vector<float> v = b.to_vector();
        rows.insert(rows.end(), v.begin(), v.end());
      }
    }
    const int64_t row = int64_t(rows.size()) / 4;
    tree_sum_rows(rows.data(), 4, row);
    rows.resize(size_t(row));
    for (int64_t i = gradient_length; i < row; ++i) rows[size_t(i)] /= 4.0f;
    before = rows;
  }

  for (double mib : {0.001, 1.0, 25.0})
    for (int64_t threads : {1, 2}) {
      CAPTURE(mib);
      CAPTURE(threads);
      auto model = fresh_model(c);
      std::vector<std::shared_ptr<Model>> replicas;
      GradientBuckets buckets;
      classification_step(*model, batch, 0.0f, Sharding{4, threads, mib}, 0, &replicas, &buckets);
      CHECK(gradients_and_statistics(*model) == before);
      // The second step's buckets follow the order backward showed in the first: the same
      // bits again.
      CHECK(buckets.order.size() == model->parameters().size() + model->named_buffers().size());
      const int64_t first_step_early = buckets.started_during_backward;
      auto again = fresh_model(c);
      classification_step(*again, batch, 0.0f, Sharding{4, threads, mib}, 0, &replicas, &buckets);
      CHECK(gradients_and_statistics(*again) == before);
      if (threads == 1 && mib < 0.01) {
        // Shards in turn: the buckets start during the last shard's backward; in the
        // second step all but those holding running statistics (added after backward); in
        // the first, whose order is a guess, most.
        MESSAGE("tiny ResNet, ", mib, " MiB buckets: ", first_step_early, " (first step), ",
                buckets.started_during_backward, " (second) of ", buckets.buckets, " started before backward returned");
        std::vector<int64_t> sizes;
        for (const Tensor& p : again->parameters()) sizes.push_back(p.numel());
        for (const auto& [name, b] : again->named_buffers()) sizes.push_back(b.numel());
        int64_t without_statistics = 0;
        for (const std::vector<int64_t>& bucket : plan_buckets(sizes, buckets.order, mib))
          without_statistics += *std::max_element(bucket.begin(), bucket.end()) < int64_t(again->parameters().size());
        CHECK(buckets.buckets > 10);
        CHECK(first_step_early > buckets.buckets / 2);
        CHECK(buckets.started_during_backward == without_statistics);
      }
    }
}

TEST_CASE("training step: a ResNet-18 of width 1/4 in 1/4 MiB buckets starts nearly all of them during backward") {
  // The figure docs/cluster.md quotes: of the buckets of a step, how many started (their
  // all-gather) before backward returned.
  const ModelConfig c = grey_resnet18(0.25, 28, 10);
  const Batch batch = random_grey_batch(4, 28, 10, 5);
  auto model = fresh_model(c);
  GradientBuckets buckets;
  std::vector<int64_t> early;
  for (int step = 0; step < 2; ++step) {
    model->zero_grad();
    classification_step(*model, batch, 0.0f, Sharding{2, 1, 0.25}, step, nullptr, &buckets);
    early.push_back(buckets.started_during_backward);
  }
  MESSAGE("ResNet-18 width 1/4, 0.25 MiB buckets: ", early[0], " (first step, parameters last to first), ", early[1],
          " (second, in backward's order) of ", buckets.buckets, " started before backward returned");
  CHECK(buckets.buckets >= 5);  // 2.8 MB of gradients, the largest tensors 0.6 MB each
  CHECK(early[1] >= buckets.buckets - 1);
}
