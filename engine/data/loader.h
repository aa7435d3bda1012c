// Loader: turns a Dataset into a stream of shuffled, augmented mini-batches.
//
// The stream is defined by batch(epoch, index): the examples at positions
// [index·B, index·B + B) of that epoch's order, decoded in parallel (parallel_for, one
// output slot per example) and augmented with each example's own generator. The order of
// epoch e is a permutation drawn from Philox(seed) at counter e·2⁴⁰, so every epoch is
// different yet reproducible, and resuming at (epoch, index) needs nothing but the seed.
// next() walks the stream; with prefetch on it builds batch k+1 on a background thread
// while the caller trains on batch k. Because a batch is a pure function of
// (seed, epoch, index), prefetching changes when a batch is built, never what it holds.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/data/transform.h"
#include "engine/tensor.h"

namespace adjoint {

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;  // skip the last, smaller batch of an epoch
  bool prefetch = true;    // build the next batch in the background
  uint64_t seed = 0;       // shuffling and augmentation
  Transforms transforms;   // applied in order to every example
  // The rows of each batch that are decoded and augmented: those of parts first … first +
  // count − 1 when a batch of n rows is cut into `of` parts by index (part s: rows s·n/of …
  // (s+1)·n/of − 1, as the shards of models/training.h). The other rows' inputs and labels
  // are zeros, never read: a data-parallel rank decodes only the shards it computes. Each
  // example's augmentation draws from its own generator (seed, epoch, index), so a row's
  // values do not depend on who decodes it. The default: every row.
  struct Rows {
    int64_t of = 1, first = 0, count = 1;
  };
  Rows decode = {};
};

struct Batch {
  Tensor inputs;                 // (N, *example shape after the transforms)
  std::vector<int64_t> labels;   // N × target_length, example-major
  std::vector<int64_t> indices;  // the dataset index of each example
  int64_t epoch = 0;             // where this batch sits in the stream
  int64_t index = 0;
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

// A Loader is driven from one thread (the training loop); its worker is internal.
class Loader {
public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();  // waits for a batch still being prefetched and stops the worker thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // One example's shape after the transforms (a batch is (N, *example_shape())).
  const Shape& example_shape() const { return example_shape_; }

  // The dataset indices in the order epoch `epoch` visits them.
  std::vector<int64_t> order(int64_t epoch) const;
  // Batch `index` of epoch `epoch`, built now on the calling thread.
  Batch batch(int64_t epoch, int64_t index) const;

  // The next batch of the stream; after an epoch's last batch comes the next epoch's
  // first. Errors of a prefetched batch (a corrupt image, say) surface here.
  Batch next();
  // The position of the batch next() returns.
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return index_; }
  // Continues the stream at batch `index` of `epoch` (resuming from a checkpoint saved
  // after that many steps: epoch = step / batches_per_epoch, index = step % it).
  void seek(int64_t epoch, int64_t index);

private:
  std::shared_ptr<const std::vector<int64_t>> cached_order(int64_t epoch) const;
  void start_prefetch();   // asks the worker for batch (epoch_, index_)
  Batch take_prefetched();  // waits for it; rethrows its error
  void drop_prefetch();    // waits for it and discards it
  void worker_loop();

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  Shape example_shape_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0, index_ = 0;

  // One long-lived worker builds one batch at a time (a thread per batch costs more than
  // decoding a small one). pending_ belongs to the caller's thread; the fields after it
  // are shared with the worker and guarded by worker_mutex_.
  bool pending_ = false;  // a request was made and its result not yet taken
  std::thread worker_;
  std::mutex worker_mutex_;
  std::condition_variable worker_wake_, batch_ready_;
  bool requested_ = false;  // the worker has a request to start
  bool ready_ = false;      // the worker has finished it
  bool stopping_ = false;
  int64_t request_epoch_ = 0, request_index_ = 0;
  Batch result_;
  std::exception_ptr error_;

  // The last epoch order computed; both the caller and the worker read it.
  mutable std::mutex order_mutex_;
  mutable int64_t order_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<int64_t>> order_;
};

}  // namespace adjoint
