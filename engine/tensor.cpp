#include "engine/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

// Elements per parallel chunk of the copies and fills below: memory-bound work, so large
// chunks; results do not depend on the chunking.
constexpr int64_t kCopyChunk = 1 << 16;

namespace {

std::shared_ptr<TensorImpl> fresh(const Shape& shape) {
  for (int64_t d : shape) check(d >= 0, "Tensor: negative extent in shape ", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(numel(shape)));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  return impl;
}

// The identity on values; exists so that a strided view made dense keeps its history.
class ContiguousNode : public Node {
public:
  std::string name() const override { return "contiguous"; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override { return {cotangent}; }
};

}  // namespace

namespace {
std::atomic<int64_t> live_bytes{0}, peak_bytes{0};
std::atomic<uint64_t> storages_made{0};

void count_bytes(int64_t delta) {
  const int64_t now = live_bytes += delta;
  int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// A training step frees and allocates the same activations, step after step. glibc hands
// freed blocks back to the system (above its adaptive mmap threshold, and the free top of
// the heap above its trim threshold), so every step would fault them in again and the
// kernel would zero each page (what that cost: docs/benchmarks.md). Freed memory stays in
// the process instead (every block comes from the heap, none from its own mapping: glibc
// maps a block above its largest mmap threshold, 32 MiB, afresh at every allocation, and a
// VGG's activations at 224 pixels are 103 MB; the heap is never trimmed), which PyTorch
// gets from its caching allocator on GPUs. The resident set then stays at the peak of live
// tensors. A user's own malloc settings (MALLOC_MMAP_THRESHOLD_, MALLOC_MMAP_MAX_,
// MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES) are left alone: `adjoint bench models` measures
// step memory with one of them.
void keep_freed_memory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* setting : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"})
      if (std::getenv(setting) != nullptr) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  });
#endif
}

// `size` floats, aligned to a cache line. The alignment is made here, from a plain malloc
// of 64 bytes more: glibc's aligned allocation asks its heap for more than the block it
// keeps, so a freed block never fits the next request of its own size once anything was
// allocated after it, and every step would grow the heap into fresh pages (which the kernel
// faults in and zeroes) instead of reusing the last step's.
constexpr size_t kAlignment = 64;
float* allocate_floats(size_t size) {
  keep_freed_memory();
  void* block = std::malloc(std::max<size_t>(size, 1) * sizeof(float) + kAlignment);
  if (block == nullptr) throw std::bad_alloc();
  // The first aligned address past the block's start: malloc aligns to 16 bytes, so the
  // 8 bytes before it, inside the block, keep the block's address for free_floats.
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(block) + kAlignment) & ~uintptr_t(kAlignment - 1);
  reinterpret_cast<void**>(aligned)[-1] = block;
  return reinterpret_cast<float*>(aligned);
}
void free_floats(float* data) { std::free(reinterpret_cast<void**>(data)[-1]); }

}  // namespace

Storage::Storage(size_t size) : data_(allocate_floats(size)), size_(size), id_(++storages_made) {
#ifndef NDEBUG
  // Debug builds (the sanitizer build among them) fill new storage with NaN, so that code
  // reading entries it never wrote shows in its results instead of passing by the luck of
  // freshly zeroed pages.
  std::fill(data_, data_ + size, std::numeric_limits<float>::quiet_NaN());
#endif
  count_bytes(int64_t(size * sizeof(float)));
}
Storage::~Storage() {
  live_bytes -= int64_t(size_ * sizeof(float));
  free_floats(data_);
}

namespace {

// What the budget sees of every storage's forms: their bytes together, the list of the
// storages that have kept any (so that the least recently used form can be found among
// them), and the clock that stamps each use. Lock order: this list's mutex, then a storage's.
struct KeptForms {
  std::mutex mutex;
  std::unordered_set<PreparedForms*> listed;
  std::atomic<int64_t> bytes{0}, evictions{0};
  std::atomic<uint64_t> clock{0};
};
KeptForms& kept_forms() {
  static KeptForms* kept = new KeptForms;  // never destroyed: storages may outlive static destruction
  return *kept;
}

// ADJOINT_PREPARED_FORMS_MIB as bytes (negative: unlimited), or the default where unset.
int64_t budget_from_environment() {
  const char* text = std::getenv("ADJOINT_PREPARED_FORMS_MIB");
  if (text == nullptr) return kDefaultPreparedFormsMiB << 20;
  const std::string value(text);
  if (value == "unlimited") return -1;
  char* end = nullptr;
  const long long mib = std::strtoll(text, &end, 10);
  if (value.empty() || *end != '\0' || mib < 0 || mib >= (int64_t(1) << 40))
    throw UsageError(cat("ADJOINT_PREPARED_FORMS_MIB: expected a count of MiB (0 or more) or 'unlimited', got '", value, "'"));
  return int64_t(mib) << 20;
}

std::atomic<int64_t>& budget_bytes() {
  static std::atomic<int64_t> budget{budget_from_environment()};
  return budget;
}

}  // namespace

int64_t prepared_forms_budget() { return budget_bytes().load(std::memory_order_relaxed); }

void set_prepared_forms_budget(int64_t bytes) {
  budget_bytes().store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed);
  PreparedForms::fit_budget();
}

PreparedForms::~PreparedForms() {
  if (listed_) {
    std::lock_guard<std::mutex> lock(kept_forms().mutex);
    kept_forms().listed.erase(this);
  }
  for (const Form& f : forms_) {
    count_bytes(-f.bytes);
    kept_forms().bytes -= f.bytes;
  }
}

void PreparedForms::drop(size_t i, std::vector<std::shared_ptr<const void>>& released) {
  count_bytes(-forms_[i].bytes);
  kept_forms().bytes -= forms_[i].bytes;
  released.push_back(std::move(forms_[i].value));
  forms_.erase(forms_.begin() + std::ptrdiff_t(i));
  count_.store(forms_.size(), std::memory_order_relaxed);
}

void PreparedForms::clear() {
  std::vector<std::shared_ptr<const void>> released;  // freed after the mutex is let go
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = forms_.size(); i-- > 0;) drop(i, released);
}

std::shared_ptr<const void> PreparedForms::find(const Key& key, uint64_t version) {
  std::vector<std::shared_ptr<const void>> released;
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<const void> found;
  for (size_t i = forms_.size(); i-- > 0;) {
    if (forms_[i].version != version) {
      drop(i, released);
    } else if (forms_[i].key == key) {
      found = forms_[i].value;
      forms_[i].last_use = ++kept_forms().clock;
    }
  }
  return found;
}

void PreparedForms::keep(Key key, uint64_t version, std::shared_ptr<const void> form, int64_t bytes) {
  KeptForms& kept = kept_forms();
  {
    std::vector<std::shared_ptr<const void>> released;
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = forms_.size(); i-- > 0;)
      if (forms_[i].key == key || forms_[i].version != version) drop(i, released);
    if (forms_.size() >= kMaxForms) drop(0, released);
    forms_.push_back({std::move(key), version, std::move(form), bytes, ++kept.clock});
    count_.store(forms_.size(), std::memory_order_relaxed);
    count_bytes(bytes);
    kept.bytes += bytes;
  }
  {
    std::lock_guard<std::mutex> lock(kept.mutex);
    if (!listed_) kept.listed.insert(this), listed_ = true;
  }
  const int64_t budget = prepared_forms_budget();
  if (budget >= 0 && kept.bytes.load() > budget) fit_budget();
}

void PreparedForms::fit_budget() {
  KeptForms& kept = kept_forms();
  std::vector<std::shared_ptr<const void>> released;  // freed once both mutexes are let go
  std::lock_guard<std::mutex> lock(kept.mutex);
  for (;;) {
    const int64_t budget = prepared_forms_budget();
    if (budget < 0 || kept.bytes.load() <= budget) break;
    // The least recently used form that holds bytes of its own, over every storage.
    PreparedForms* oldest_owner = nullptr;
    uint64_t oldest_use = UINT64_MAX;
    for (PreparedForms* forms : kept.listed) {
      std::lock_guard<std::mutex> own(forms->mutex_);
      for (const Form& f : forms->forms_)
        if (f.bytes > 0 && f.last_use < oldest_use) oldest_use = f.last_use, oldest_owner = forms;
    }
    if (oldest_owner == nullptr) break;
    std::lock_guard<std::mutex> own(oldest_owner->mutex_);
    for (size_t i = 0; i < oldest_owner->forms_.size(); ++i)
      if (oldest_owner->forms_[i].last_use == oldest_use) {
        oldest_owner->drop(i, released);
        ++kept.evictions;
        break;
      }
  }
}

size_t PreparedForms::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return forms_.size();
}

int64_t PreparedForms::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const Form& f : forms_) total += f.bytes;
  return total;
}

MemoryStats memory_stats() {
  return {live_bytes.load(), peak_bytes.load(), kept_forms().bytes.load(), kept_forms().evictions.load()};
}
void reset_peak_memory() { peak_bytes = live_bytes.load(); }

Tensor Tensor::empty(const Shape& shape) { return Tensor(fresh(shape)); }
Tensor Tensor::zeros(const Shape& shape) { return full(shape, 0.0f); }
Tensor Tensor::ones(const Shape& shape) { return full(shape, 1.0f); }
Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape);
  t.fill_(value);
  return t;
}
Tensor Tensor::scalar(float value) { return full({}, value); }
Tensor Tensor::from_vector(const Shape& shape, std::vector<float> values) {
  check(static_cast<int64_t>(values.size()) == adjoint::numel(shape), "Tensor::from_vector: ",
        values.size(), " values do not fill shape ", shape);
  Tensor t = empty(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

TensorImpl& Tensor::checked() const {
  check(impl_ != nullptr, "Tensor: use of an undefined tensor");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
int64_t Tensor::size(int64_t axis) const { return shape()[normalize_axis(axis, dim(), "Tensor::size")]; }
int64_t Tensor::numel() const { return adjoint::numel(shape()); }

bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked();
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

void copy_to_dense(const Tensor& src, float* dst) {
  const TensorImpl& t = *src.impl();
  const float* base = std::as_const(*t.storage).data() + t.offset;
  const int64_t rank = static_cast<int64_t>(t.shape.size());
  const int64_t n = numel(t.shape);
  if (n == 0) return;
  if (src.is_contiguous()) {
    parallel_for(n, kCopyChunk, [&](int64_t b, int64_t e) {
      std::memcpy(dst + b, base + b, sizeof(float) * static_cast<size_t>(e - b));
    });
    return;
  }
  // Runs along the innermost axis, each strided; chunks of runs in parallel. A chunk
  // finds its first run's offset from the run's index, then walks the index like an
  // odometer.
  const int64_t inner = rank ? t.shape[rank - 1] : 1;
  const int64_t inner_stride = rank ? t.strides[rank - 1] : 0;
  const int64_t runs = n / inner;
  parallel_for(runs, std::max<int64_t>(1, kCopyChunk / inner), [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> index(static_cast<size_t>(std::max<int64_t>(rank - 1, 0)), 0);
    int64_t pos = 0;  // offset of the current run
    for (int64_t a = rank - 2, rest = r0; a >= 0; --a) {
      index[size_t(a)] = rest % t.shape[a];
      rest /= t.shape[a];
      pos += index[size_t(a)] * t.strides[a];
    }
    float* out = dst + r0 * inner;
    for (int64_t r = r0; r < r1; ++r) {
      const float* run = base + pos;
      for (int64_t j = 0; j < inner; ++j) *out++ = run[j * inner_stride];
      for (int64_t a = rank - 2; a >= 0; --a) {
        pos += t.strides[a];
        if (++index[size_t(a)] < t.shape[a]) break;
        pos -= t.strides[a] * t.shape[a];
        index[size_t(a)] = 0;
      }
    }
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape());
  copy_to_dense(*this, out.data());
  if (needs_grad({*this})) attach(out, std::make_shared<ContiguousNode>(), {*this});
  return out;
}

float* Tensor::data() {
  TensorImpl& t = checked();
  check(is_contiguous(), "Tensor::data: tensor of shape ", t.shape, " is not contiguous");
  return t.storage->data() + t.offset;
}
const float* Tensor::data() const {
  const TensorImpl& t = checked();
  check(is_contiguous(), "Tensor::data: tensor of shape ", t.shape, " is not contiguous");
  return std::as_const(*t.storage).data() + t.offset;
}

uint64_t Tensor::version() const { return checked().storage->version(); }

float Tensor::at(std::initializer_list<int64_t> index) const {
  const TensorImpl& t = checked();
  check(static_cast<int64_t>(index.size()) == dim(), "Tensor::at: ", index.size(),
        " indices for a tensor of shape ", t.shape);
  int64_t pos = t.offset, a = 0;
  for (int64_t i : index) {
    check(i >= 0 && i < t.shape[a], "Tensor::at: index ", i, " out of range on axis ", a,
          " of shape ", t.shape);
    pos += i * t.strides[a++];
  }
  return std::as_const(*t.storage)[static_cast<size_t>(pos)];
}

float Tensor::item() const {
  check(numel() == 1, "Tensor::item: tensor of shape ", shape(), " has ", numel(), " elements");
  return std::as_const(*impl_->storage)[static_cast<size_t>(impl_->offset)];
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  copy_to_dense(*this, v.data());
  return v;
}

Tensor Tensor::detach() const {
  const TensorImpl& t = checked();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage;
  impl->shape = t.shape;
  impl->strides = t.strides;
  impl->offset = t.offset;
  return Tensor(impl);
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape());
  copy_to_dense(*this, out.data());
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  check(src.shape() == shape(), "Tensor::copy_from: source shape ", src.shape(),
        " differs from destination shape ", shape());
  if (is_contiguous()) {
    copy_to_dense(src, data());
    return;
  }
  throw Error(cat("Tensor::copy_from: destination of shape ", shape(), " is not contiguous"));
}

void Tensor::fill_(float value) {
  float* p = data();
  parallel_for(numel(), kCopyChunk, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, value); });
}

bool Tensor::requires_grad() const {
  return defined() && (impl_->requires_grad || impl_->grad_fn != nullptr);
}
Tensor& Tensor::requires_grad_(bool on) {
  check(is_leaf(), "Tensor::requires_grad_: only leaves (tensors made outside autograd) can ask for grads");
  checked().requires_grad = on;
  return *this;
}
bool Tensor::is_leaf() const { return checked().grad_fn == nullptr; }
const std::shared_ptr<Node>& Tensor::grad_fn() const { return checked().grad_fn; }
Tensor Tensor::grad() const { return Tensor(checked().grad); }
void Tensor::zero_grad() { checked().grad.reset(); }
void Tensor::set_grad(const Tensor& g) {
  check(!g.defined() || g.shape() == shape(), "Tensor::set_grad: gradient shape ", g.shape(),
        " differs from tensor shape ", shape());
  checked().grad = g.impl_ptr();
}

Tensor Tensor::view_as_strided(const Shape& new_shape, const Shape& new_strides, int64_t new_offset) const {
  const TensorImpl& t = checked();
  check(new_shape.size() == new_strides.size(), "Tensor::view_as_strided: shape ", new_shape,
        " and strides ", new_strides, " differ in rank");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage;
  impl->shape = new_shape;
  impl->strides = new_strides;
  impl->offset = new_offset;
  return Tensor(impl);
}

}  // namespace adjoint
