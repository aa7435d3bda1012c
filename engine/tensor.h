// Tensor: a float32 N-d array over refcounted storage, with the autograd links.
//
// Storage is shared between views: reshape of a contiguous tensor, permute, slice and
// broadcast_to (stride 0) are views; ops that need dense memory call contiguous(), which
// copies only when the layout is not already row-major. A tensor produced by an op
// while autograd records carries grad_fn, the node that transports cotangents back.
#pragma once
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/shape.h"

namespace adjoint {

class Node;
class Tensor;

// A float buffer, 64-byte aligned and left uninitialised: factories that promise values
// (zeros, full) write them; ops overwrite every element they allocate.
class Storage {
public:
  explicit Storage(size_t size);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  float& operator[](size_t i) { return data_[i]; }

private:
  float* data_;
  size_t size_;
};

// Bytes held by all live tensor storage, and the most held at once since the last reset:
// what `adjoint bench models` reports as a training step's peak memory.
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
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
  // Dense pointer to the first element. Throws unless the tensor is contiguous.
  float* data();
  const float* data() const;
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

// Copies a strided tensor's values into dense row-major memory.
void copy_to_dense(const Tensor& src, float* dst);

}  // namespace adjoint
