#include "engine/data/loader.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <numeric>
#include <utility>

#include "engine/error.h"
#include "engine/random.h"
#include "engine/threads.h"

namespace adjoint {

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  check(dataset_ != nullptr, "Loader: no dataset");
  const int64_t n = dataset_->size(), b = options_.batch_size;
  check(b > 0, "Loader(", dataset_->name(), "): batch size must be positive, got ", b);
  check(n > 0, "Loader(", dataset_->name(), "): the dataset is empty");
  batches_per_epoch_ = options_.drop_last ? n / b : (n + b - 1) / b;
  check(batches_per_epoch_ > 0, "Loader(", dataset_->name(), "): ", n, " examples make no full batch of ", b,
        " with drop_last");
  example_shape_ = transformed_shape(options_.transforms, dataset_->shape());
  const LoaderOptions::Rows& decode = options_.decode;
  check(decode.of >= 1 && decode.first >= 0 && decode.count >= 1 && decode.first + decode.count <= decode.of,
        "Loader(", dataset_->name(), "): parts ", decode.first, " … ", decode.first + decode.count - 1, " of ", decode.of);
}

Loader::~Loader() {
  drop_prefetch();
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(worker_mutex_);
    stopping_ = true;
  }
  worker_wake_.notify_one();
  worker_.join();
}

std::vector<int64_t> Loader::order(int64_t epoch) const {
  check(epoch >= 0, "Loader(", dataset_->name(), "): negative epoch ", epoch);
  const int64_t n = dataset_->size();
  if (!options_.shuffle) {
    std::vector<int64_t> identity(static_cast<size_t>(n));
    std::iota(identity.begin(), identity.end(), 0);
    return identity;
  }
  // Each epoch owns the counters [e·2⁴⁰, (e+1)·2⁴⁰) of the seed's stream.
  Generator gen;
  gen.set_state(options_.seed, static_cast<uint64_t>(epoch) << 40);
  return permutation(n, gen);
}

std::shared_ptr<const std::vector<int64_t>> Loader::cached_order(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(order_mutex_);
  if (order_epoch_ != epoch || order_ == nullptr) {
    order_ = std::make_shared<const std::vector<int64_t>>(order(epoch));
    order_epoch_ = epoch;
  }
  return order_;
}

Batch Loader::batch(int64_t epoch, int64_t index) const {
  check(epoch >= 0 && index >= 0 && index < batches_per_epoch_, "Loader(", dataset_->name(), "): no batch ", index,
        " in epoch ", epoch, " (", batches_per_epoch_, " batches per epoch)");
  const std::shared_ptr<const std::vector<int64_t>> order = cached_order(epoch);
  const int64_t n = dataset_->size(), begin = index * options_.batch_size;
  const int64_t count = std::min(n, begin + options_.batch_size) - begin;

  Batch out;
  out.epoch = epoch, out.index = index;
  out.indices.assign(order->begin() + begin, order->begin() + begin + count);
  Shape batch_shape = {count};
  batch_shape.insert(batch_shape.end(), example_shape_.begin(), example_shape_.end());
  out.inputs = Tensor::empty(batch_shape);
  const int64_t targets = dataset_->target_length();
  out.labels.resize(static_cast<size_t>(count * targets));

  const Shape raw_shape = dataset_->shape();
  const int64_t raw_numel = numel(raw_shape), out_numel = numel(example_shape_);
  float* inputs = out.inputs.data();
  int64_t* labels = out.labels.data();
  const std::vector<int64_t>& indices = out.indices;
  // The rows decoded here (options_.decode); the others zeros.
  const LoaderOptions::Rows& decode = options_.decode;
  const int64_t first_row = decode.first * count / decode.of, last_row = (decode.first + decode.count) * count / decode.of;
  std::fill(inputs, inputs + first_row * out_numel, 0.0f);
  std::fill(inputs + last_row * out_numel, inputs + count * out_numel, 0.0f);
  std::fill(labels, labels + first_row * targets, int64_t(0));
  std::fill(labels + last_row * targets, labels + count * targets, int64_t(0));
  // Small examples are grouped so a chunk is worth a task; each writes only its own slot.
  // A chunk stops at its first example that fails to decode; of those, the error of the
  // batch's earliest row is the one thrown, so the file an error names does not depend on
  // how the rows were split among threads.
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(raw_numel, 1));
  std::mutex error_mutex;
  int64_t error_row = count;
  std::exception_ptr error;
  parallel_for(last_row - first_row, grain, [&](int64_t b, int64_t e) {
    std::vector<float> raw;
    int64_t k = first_row + b;
    try {
      for (; k < first_row + e; ++k) {
        const int64_t i = indices[static_cast<size_t>(k)];
        float* slot = inputs + k * out_numel;
        if (options_.transforms.empty()) {
          dataset_->get(i, slot, labels + k * targets);
          continue;
        }
        raw.resize(static_cast<size_t>(raw_numel));
        dataset_->get(i, raw.data(), labels + k * targets);
        Shape shape = raw_shape;
        Generator gen = example_generator(options_.seed, epoch, i);
        const std::vector<float> result = apply_transforms(options_.transforms, std::move(raw), shape, gen);
        std::copy(result.begin(), result.end(), slot);
        raw.clear();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (k < error_row) error_row = k, error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  return out;
}

Batch Loader::next() {
  Batch out = pending_ ? take_prefetched() : batch(epoch_, index_);
  if (++index_ == batches_per_epoch_) index_ = 0, ++epoch_;
  start_prefetch();
  return out;
}

void Loader::seek(int64_t epoch, int64_t index) {
  check(epoch >= 0 && index >= 0 && index < batches_per_epoch_, "Loader(", dataset_->name(), "): cannot seek to batch ",
        index, " of epoch ", epoch, " (", batches_per_epoch_, " batches per epoch)");
  drop_prefetch();
  epoch_ = epoch, index_ = index;
}

void Loader::start_prefetch() {
  if (!options_.prefetch) return;
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  {
    std::lock_guard<std::mutex> lock(worker_mutex_);
    request_epoch_ = epoch_, request_index_ = index_;
    pending_ = requested_ = true;
    ready_ = false;
  }
  worker_wake_.notify_one();
}

Batch Loader::take_prefetched() {
  std::unique_lock<std::mutex> lock(worker_mutex_);
  batch_ready_.wait(lock, [this] { return ready_; });
  pending_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::move(result_);
}

void Loader::drop_prefetch() {
  if (!pending_) return;
  // Nobody asked for this batch any more: wait for it, then forget it and its error.
  try {
    take_prefetched();
  } catch (const std::exception&) {
  }
}

void Loader::worker_loop() {
  std::unique_lock<std::mutex> lock(worker_mutex_);
  for (;;) {
    worker_wake_.wait(lock, [this] { return requested_ || stopping_; });
    if (stopping_) return;
    requested_ = false;
    const int64_t epoch = request_epoch_, index = request_index_;
    lock.unlock();
    // batch() reads only const state (the dataset, the options, the locked order cache).
    Batch built;
    std::exception_ptr error;
    try {
      built = batch(epoch, index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    result_ = std::move(built);
    error_ = error;
    ready_ = true;
    batch_ready_.notify_one();
  }
}

}  // namespace adjoint
