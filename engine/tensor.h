// Tensor: a float32 N-d array over refcounted storage, with the autograd links.
//
// Storage is shared between views: reshape of a contiguous tensor, permute, slice and
// broadcast_to (stride 0) are views; ops that need dense memory call contiguous(), which
// copies only when the layout is not already row-major. A tensor produced by an op
// while autograd records carries grad_fn, the node that transports cotangents back.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/shape.h"

namespace adjoint {

class Node;
class Tensor;

// Forms that kernels prepare from a storage's values (a convolution's weights transformed for
// Winograd, packed for a GEMM, folded with a BatchNorm), kept beside the storage, so that a
// model's weights are prepared once per version of their values rather than at every call.
// The storage owns them: they go when it goes, so nothing outlives the model. A form is
// found by its key (which kind of form, and everything else its values depend on, other
// storages' ids and versions among them) and is valid while the storage's version is the one
// it was made at. At most kMaxForms are kept; stale forms go first, then the oldest. Their
// bytes count in MemoryStats while kept, and against one budget for the whole process
// (prepared_forms_budget): past it, the least recently used forms of any storage go, so that
// a model's kept forms stay bounded whatever its size. A form that goes is made again when
// next needed, from the same values, so results do not depend on what was dropped.
class PreparedForms {
public:
  using Key = std::vector<uint64_t>;
  static constexpr size_t kMaxForms = 6;
  PreparedForms() = default;
  PreparedForms(const PreparedForms&) = delete;
  PreparedForms& operator=(const PreparedForms&) = delete;
  ~PreparedForms();
  // The form kept under `key` at `version`, else null (and every form of another version goes).
  std::shared_ptr<const void> find(const Key& key, uint64_t version);
  // Keeps `form` (of `bytes` bytes) under `key`, made from the values at `version`.
  void keep(Key key, uint64_t version, std::shared_ptr<const void> form, int64_t bytes);
  size_t size() const;    // forms kept
  int64_t bytes() const;  // their bytes
  // Whether any form may be kept: one load, for the write path.
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }
  // Drops every form (the values were written: none is valid any more).
  void clear();
  // Drops the least recently used forms of the process until their bytes fit the budget.
  static void fit_budget();

private:
  struct Form {
    Key key;
    uint64_t version;
    std::shared_ptr<const void> value;
    int64_t bytes;
    uint64_t last_use;  // a tick of one clock shared by every storage's forms
  };
  // Removes form i, with the mutex held; its value goes to `released`, freed by the caller
  // once no mutex is held (a form may own a tensor whose own forms then go).
  void drop(size_t i, std::vector<std::shared_ptr<const void>>& released);
  mutable std::mutex mutex_;
  std::vector<Form> forms_;
  std::atomic<size_t> count_{0};  // forms_.size(), readable without the mutex
  bool listed_ = false;            // in the process's list of storages with forms (its mutex)
};

// The budget for the bytes of kept prepared forms, the whole process's together: by default
// kDefaultPreparedFormsMiB, or the environment's ADJOINT_PREPARED_FORMS_MIB (a count of MiB,
// 0 keeps none, "unlimited" drops none) read at the first use; the setter overrides both, a
// negative value meaning unlimited, and drops what no longer fits at once. Forms whose bytes
// are tensors (reported as 0, since tensors count themselves) are bounded by their count per
// storage only. The default holds every form of any one of the paper's models, so that a
// model's passes reuse them all, and bounds a process that holds several: a budget below one
// model's forms gains little, since a pass uses each layer's forms once, in layer order, and
// the least recently used is then always the next one needed (docs/benchmarks.md).
inline constexpr int64_t kDefaultPreparedFormsMiB = 1024;
int64_t prepared_forms_budget();  // bytes; negative: unlimited
void set_prepared_forms_budget(int64_t bytes);

// A float buffer, 64-byte aligned and left uninitialised: factories that promise values
// (zeros, full) write them; ops overwrite every element they allocate.
//
// Its version counts writes: every non-const access to its values (data(), operator[])
// counts as one, whether or not it then writes, so that every writer (an optimiser's step,
// a loader, copy_from, fill_, an op writing its output) moves it without further care; it
// also drops the forms kept from the old values, so that a training step after an eval
// pass does not hold them. Code that only reads goes through a const Storage or Tensor. A
// pointer taken for writing is written through before the values are next read by an op
// that keeps prepared forms.
class Storage {
public:
  explicit Storage(size_t size);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  float* data() {
    bump_version();
    if (prepared_.any()) prepared_.clear();
    return data_;
  }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  float& operator[](size_t i) { return data()[i]; }
  const float& operator[](size_t i) const { return data_[i]; }

  // Unique among the storages of the process, never reused.
  uint64_t id() const { return id_; }
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  PreparedForms& prepared() const { return prepared_; }

private:
  float* data_;
  size_t size_;
  uint64_t id_;
  std::atomic<uint64_t> version_{0};
  mutable PreparedForms prepared_;
};

// Bytes held by all live tensor storage, and the most held at once since the last reset:
// what `adjoint bench models` reports as a training step's peak memory.
// Also the bytes of prepared forms kept now (PreparedForms) and how many forms the budget
// has dropped since the process started.
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t prepared_bytes = 0;
  int64_t prepared_evictions = 0;
};
MemoryStats memory_stats();
void reset_peak_memory();

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements; 0 on a broadcast axis
  int64_t offset = 0;  // first element in storage
  bool requires_grad = false;        // set on leaves (parameters, explained inputs)
  std::shared_ptr<TensorImpl> grad;  // accumulated on leaves by backward()
  std::shared_ptr<Node> grad_fn;     // set on op outputs while recording
};

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories. Every new tensor is contiguous and owns fresh storage.
  static Tensor empty(const Shape& shape);
  static Tensor zeros(const Shape& shape);
  static Tensor ones(const Shape& shape);
  static Tensor full(const Shape& shape, float value);
  static Tensor scalar(float value);
  static Tensor from_vector(const Shape& shape, std::vector<float> values);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const;

  bool is_contiguous() const;
  // The same values in row-major storage: this tensor itself when it already is, else a
  // copy that autograd sees as the identity.
  Tensor contiguous() const;
  // Dense pointer to the first element. Throws unless the tensor is contiguous. The
  // non-const one counts as a write (Storage's version).
  float* data();
  const float* data() const;
  // The version of the values: its storage's (Storage), moved by every write.
  uint64_t version() const;

  // The form of this tensor's values that `make` prepares, kept with its storage
  // (PreparedForms) under `key`, to which this view's offset and shape are added, while the
  // values stay at this version; `make` returns the form and the bytes it holds (0 where
  // they are tensors, which count themselves).
  template <class Form>
  std::shared_ptr<const Form> prepared(
      PreparedForms::Key key, const std::function<std::pair<std::shared_ptr<const Form>, int64_t>()>& make) const;
  // Element at a full index, whatever the layout (tests and debugging, not hot loops).
  float at(std::initializer_list<int64_t> index) const;
  float item() const;  // the single element of a one-element tensor
  std::vector<float> to_vector() const;  // row-major copy of the values

  // A new tensor sharing storage, with no autograd history.
  Tensor detach() const;
  // A deep copy (fresh storage, contiguous), with no autograd history.
  Tensor clone() const;
  // Copies values from `src` (same shape) into this tensor's storage. Not recorded.
  void copy_from(const Tensor& src);
  void fill_(float value);

  // Autograd.
  bool requires_grad() const;  // a leaf that asks for grads, or an op output in a graph
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  Tensor grad() const;  // undefined until backward() reaches this leaf
  void zero_grad();     // drops the accumulated gradient
  void set_grad(const Tensor& g);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // A view on the same storage with another shape/strides/offset (no copy, no history).
  Tensor view_as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

private:
  TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

template <class Form>
std::shared_ptr<const Form> Tensor::prepared(
    PreparedForms::Key key, const std::function<std::pair<std::shared_ptr<const Form>, int64_t>()>& make) const {
  const TensorImpl& t = checked();
  key.push_back(uint64_t(t.offset));
  for (int64_t extent : t.shape) key.push_back(uint64_t(extent));
  for (int64_t stride : t.strides) key.push_back(uint64_t(stride));
  PreparedForms& forms = t.storage->prepared();
  const uint64_t version = t.storage->version();
  if (auto kept = forms.find(key, version)) return std::static_pointer_cast<const Form>(kept);
  auto [form, bytes] = make();
  forms.keep(std::move(key), version, form, bytes);
  return form;
}

// Copies a strided tensor's values into dense row-major memory.
void copy_to_dense(const Tensor& src, float* dst);

}  // namespace adjoint
