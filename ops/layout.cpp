// Layout ops: views with a recorded transport, and the few that must copy (concat, pad).
#include "ops/layout.h"

#include <algorithm>
#include <memory>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

constexpr int64_t kGrain = 16384;

// Writes the values of `src` (any layout, same shape) into the strided view `dst`.
// Rows of the last axis are the parallel work items; each finds its start by index
// arithmetic, so the rows are independent.
void write_into(const Tensor& dst, const Tensor& src) {
  const Tensor s = src.detach().contiguous();
  const Shape& shape = dst.shape();
  const Shape& strides = dst.strides();
  const int64_t rank = dst.dim();
  if (s.numel() == 0) return;
  const int64_t inner = rank ? shape[rank - 1] : 1;
  const int64_t inner_stride = rank ? strides[rank - 1] : 1;
  const int64_t rows = s.numel() / inner;
  float* base = dst.impl()->storage->data() + dst.impl()->offset;
  const float* from = s.data();
  parallel_for(rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t pos = 0, rest = row;
      for (int64_t a = rank - 2; a >= 0; --a) {
        pos += (rest % shape[a]) * strides[a];
        rest /= shape[a];
      }
      float* to = base + pos;
      const float* in = from + row * inner;
      if (inner_stride == 1) {
        std::copy(in, in + inner, to);
      } else {
        for (int64_t j = 0; j < inner; ++j) to[j * inner_stride] = in[j];
      }
    }
  });
}

// A view of x (same storage), recorded with `node` when x takes part in a graph.
Tensor make_view(const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset,
                 const std::shared_ptr<Node>& node) {
  Tensor out = x.view_as_strided(shape, strides, offset);
  if (needs_grad({x})) attach(out, node, {x});
  return out;
}

// reshape, flatten, squeeze, unsqueeze: the cotangent takes the input's shape again.
class ReshapeNode : public Node {
public:
  ReshapeNode(const char* name, Shape input_shape) : name_(name), input_shape_(std::move(input_shape)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override {
    const Tensor u = cotangent.contiguous();
    return {u.view_as_strided(input_shape_, contiguous_strides(input_shape_), u.impl()->offset)};
  }

private:
  const char* name_;
  Shape input_shape_;
};

// permute: the cotangent is permuted back by the inverse permutation.
class PermuteNode : public Node {
public:
  explicit PermuteNode(std::vector<int64_t> axes) : axes_(std::move(axes)) {}
  std::string name() const override { return "permute"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    std::vector<int64_t> inverse(axes_.size());
    for (size_t i = 0; i < axes_.size(); ++i) inverse[axes_[i]] = int64_t(i);
    return {permute(u, inverse)};
  }

private:
  std::vector<int64_t> axes_;
};

// slice: the cotangent lands on the selected elements, zeros elsewhere.
class SliceNode : public Node {
public:
  SliceNode(Shape input_shape, int64_t axis, int64_t start, int64_t step)
      : input_shape_(std::move(input_shape)), axis_(axis), start_(start), step_(step) {}
  std::string name() const override { return "slice"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    Tensor g = Tensor::zeros(input_shape_);
    Shape strides = g.strides();
    const int64_t offset = start_ * strides[axis_];
    strides[axis_] *= step_;
    write_into(g.view_as_strided(u.shape(), strides, offset), u);
    return {g};
  }

private:
  Shape input_shape_;
  int64_t axis_, start_, step_;
};

// pad: the cotangent of the interior (a view of u).
class PadNode : public Node {
public:
  PadNode(Shape input_shape, Shape before) : input_shape_(std::move(input_shape)), before_(std::move(before)) {}
  std::string name() const override { return "pad"; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override {
    const Tensor u = cotangent.contiguous();
    int64_t offset = u.impl()->offset;
    for (size_t a = 0; a < before_.size(); ++a) offset += before_[a] * u.strides()[a];
    return {u.view_as_strided(input_shape_, u.strides(), offset)};
  }

private:
  Shape input_shape_, before_;
};

// concat: each input gets its slab of the cotangent.
class ConcatNode : public Node {
public:
  ConcatNode(int64_t axis, std::vector<int64_t> starts) : axis_(axis), starts_(std::move(starts)) {}
  std::string name() const override { return "concat"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    std::vector<Tensor> result(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (needs[i]) result[i] = slice(u, axis_, starts_[i], starts_[i + 1]);
    return result;
  }

private:
  int64_t axis_;
  std::vector<int64_t> starts_;  // input i covers [starts_[i], starts_[i+1]) along axis_
};

// broadcast_to: the repeated copies' cotangents are summed (sum_to).
class BroadcastNode : public Node {
public:
  explicit BroadcastNode(Shape input_shape) : input_shape_(std::move(input_shape)) {}
  std::string name() const override { return "broadcast_to"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    // detach: a fresh handle even when nothing was broadcast and sum_to returns u itself.
    return {sum_to(u, input_shape_).detach()};
  }

private:
  Shape input_shape_;
};

// Whether `from` broadcasts to `to` by NumPy rules.
bool broadcastable(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

}  // namespace

Tensor reshape(const Tensor& x, Shape shape) {
  int64_t known = 1, inferred = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      check(inferred < 0, "reshape: more than one -1 in target shape ", shape, " for input ", x.shape());
      inferred = int64_t(i);
    } else {
      check(shape[i] >= 0, "reshape: negative extent in target shape ", shape, " for input ", x.shape());
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    check(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 in ", shape, " for input ", x.shape());
    shape[inferred] = x.numel() / known;
  }
  check(numel(shape) == x.numel(), "reshape: input ", x.shape(), " has ", x.numel(), " elements, target shape ", shape,
        " has ", numel(shape));
  const Tensor c = x.contiguous();  // recorded identity copy when x is strided
  return make_view(c, shape, contiguous_strides(shape), c.impl()->offset,
                   std::make_shared<ReshapeNode>("reshape", c.shape()));
}

Tensor flatten(const Tensor& x, int64_t start_axis) {
  const int64_t start = normalize_axis(start_axis, x.dim(), "flatten");
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  shape.push_back(numel(Shape(x.shape().begin() + start, x.shape().end())));
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, std::vector<int64_t> axes) {
  const int64_t rank = x.dim();
  check(int64_t(axes.size()) == rank, "permute: ", axes.size(), " axes given for input ", x.shape());
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  Shape shape, strides;
  for (int64_t& a : axes) {
    a = normalize_axis(a, rank, "permute");
    check(!seen[a], "permute: axis ", a, " appears twice for input ", x.shape());
    seen[a] = true;
    shape.push_back(x.shape()[a]);
    strides.push_back(x.strides()[a]);
  }
  return make_view(x, shape, strides, x.impl()->offset, std::make_shared<PermuteNode>(axes));
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  std::vector<int64_t> axes(static_cast<size_t>(x.dim()));
  for (int64_t i = 0; i < x.dim(); ++i) axes[i] = i;
  std::swap(axes[normalize_axis(a, x.dim(), "transpose")], axes[normalize_axis(b, x.dim(), "transpose")]);
  return permute(x, axes);
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  const int64_t a = normalize_axis(axis, x.dim(), "slice");
  check(step >= 1, "slice: step ", step, " must be positive (input ", x.shape(), ", axis ", axis, ")");
  const int64_t extent = x.shape()[a];
  auto clip = [extent](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + extent : i, 0, extent); };
  start = clip(start);
  end = std::max(clip(end), start);
  Shape shape = x.shape(), strides = x.strides();
  shape[a] = (end - start + step - 1) / step;
  strides[a] *= step;
  return make_view(x, shape, strides, x.impl()->offset + start * x.strides()[a],
                   std::make_shared<SliceNode>(x.shape(), a, start, step));
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t axis) {
  check(!tensors.empty(), "concat: no tensors to join");
  const Shape& first = tensors[0].shape();
  const int64_t a = normalize_axis(axis, int64_t(first.size()), "concat");
  std::vector<int64_t> starts{0};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& s = tensors[i].shape();
    bool same = s.size() == first.size();
    for (size_t k = 0; same && k < s.size(); ++k) same = int64_t(k) == a || s[k] == first[k];
    check(same, "concat: tensor ", i, " has shape ", s, ", tensor 0 has ", first, "; only axis ", a, " may differ");
    starts.push_back(starts.back() + s[a]);
  }
  Shape shape = first;
  shape[a] = starts.back();
  Tensor out = Tensor::empty(shape);
  for (size_t i = 0; i < tensors.size(); ++i) {
    Shape part = shape;
    part[a] = starts[i + 1] - starts[i];
    write_into(out.view_as_strided(part, out.strides(), starts[i] * out.strides()[a]), tensors[i]);
  }
  if (needs_grad(tensors)) attach(out, std::make_shared<ConcatNode>(a, starts), tensors);
  return out;
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& before_after_per_axis, float value) {
  check(int64_t(before_after_per_axis.size()) == x.dim(), "pad: ", before_after_per_axis.size(),
        " (before, after) pairs for input ", x.shape(), "; give one per axis");
  Shape shape = x.shape(), before;
  for (size_t k = 0; k < shape.size(); ++k) {
    const auto [b, e] = before_after_per_axis[k];
    check(b >= 0 && e >= 0, "pad: negative padding (", b, ", ", e, ") on axis ", k, " of input ", x.shape());
    shape[k] += b + e;
    before.push_back(b);
  }
  Tensor out = Tensor::full(shape, value);
  int64_t offset = 0;
  for (size_t k = 0; k < shape.size(); ++k) offset += before[k] * out.strides()[k];
  write_into(out.view_as_strided(x.shape(), out.strides(), offset), x);
  if (needs_grad({x})) attach(out, std::make_shared<PadNode>(x.shape(), before), {x});
  return out;
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check(broadcastable(x.shape(), shape), "broadcast_to: cannot broadcast ", x.shape(), " to ", shape);
  const size_t lead = shape.size() - x.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i)
    strides[lead + i] = x.shape()[i] == shape[lead + i] ? x.strides()[i] : 0;
  return make_view(x, shape, strides, x.impl()->offset, std::make_shared<BroadcastNode>(x.shape()));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check(broadcastable(shape, x.shape()), "sum_to: shape ", shape, " does not broadcast to input ", x.shape());
  const size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < x.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) axes.push_back(int64_t(i));
  if (axes.empty()) return x;  // nothing was broadcast
  return reshape(sum(x, axes, true), shape);
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  const int64_t a = normalize_axis(axis, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape(), strides = x.strides();
  // Any stride fits an axis of extent 1; this one keeps a contiguous input contiguous.
  const int64_t stride = a < x.dim() ? strides[a] * shape[a] : 1;
  shape.insert(shape.begin() + a, 1);
  strides.insert(strides.begin() + a, stride);
  return make_view(x, shape, strides, x.impl()->offset, std::make_shared<ReshapeNode>("unsqueeze", x.shape()));
}

Tensor squeeze(const Tensor& x, int64_t axis) {
  const int64_t a = normalize_axis(axis, x.dim(), "squeeze");
  check(x.shape()[a] == 1, "squeeze: axis ", axis, " of input ", x.shape(), " has extent ", x.shape()[a], ", not 1");
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + a);
  strides.erase(strides.begin() + a);
  return make_view(x, shape, strides, x.impl()->offset, std::make_shared<ReshapeNode>("squeeze", x.shape()));
}

}  // namespace adjoint
