// Reductions: sum, mean, var (smooth) and max (a routing).
//
// Every reduction first arranges its input as a dense block [outer, count, inner] whose
// middle axis holds the `count` elements that one output (o, j) reduces. When the
// reduced axes are adjacent this is the input itself (no copy): reducing the last axes
// gives inner = 1, reducing leading axes gives outer = 1. Otherwise the reduced axes are
// permuted to the end and copied, giving [kept, reduced, 1].
#include "ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "ops/layout.h"

namespace adjoint {

namespace {

constexpr int64_t kGrain = 16384;

// Which axes a reduction removes and the shapes it produces.
struct Plan {
  std::vector<bool> reduced;  // per input axis
  Shape out_shape;            // the result's shape (reduced axes dropped unless keepdim)
  Shape keep_shape;           // the input shape with reduced axes set to 1
  int64_t count = 1;          // elements reduced into each output
};

Plan make_plan(const char* who, const Shape& shape, const std::vector<int64_t>& axes, bool keepdim) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  Plan p;
  p.reduced.assign(static_cast<size_t>(rank), axes.empty());
  for (int64_t axis : axes) {
    const int64_t a = normalize_axis(axis, rank, who);
    check(!p.reduced[a], who, ": axis ", axis, " is listed twice for input ", shape);
    p.reduced[a] = true;
  }
  for (int64_t a = 0; a < rank; ++a) {
    if (p.reduced[a]) {
      p.count *= shape[a];
      p.keep_shape.push_back(1);
      if (keepdim) p.out_shape.push_back(1);
    } else {
      p.keep_shape.push_back(shape[a]);
      p.out_shape.push_back(shape[a]);
    }
  }
  return p;
}

// The input's values as a dense [outer, count, inner] block (see the file comment).
struct Arranged {
  Tensor dense;
  int64_t outer = 1, count = 1, inner = 1;
  std::vector<int64_t> perm;  // input axis at each position of `dense`; empty when not permuted
};

// `rows` asks for inner = 1 (the reduced elements of an output contiguous).
Arranged arrange(const Tensor& x, const Plan& p, bool rows) {
  const Shape& shape = x.shape();
  const int64_t rank = x.dim();
  Arranged a;
  a.count = p.count;
  int64_t first = rank, last = -1;
  for (int64_t i = 0; i < rank; ++i)
    if (p.reduced[i]) first = std::min(first, i), last = std::max(last, i);
  bool adjacent = true;
  for (int64_t i = first; i <= last; ++i) adjacent = adjacent && p.reduced[i];
  if (last < 0) {  // nothing reduced (a scalar): every element is its own output
    a.dense = x.detach().contiguous();
    a.outer = x.numel();
    return a;
  }
  if (adjacent && (!rows || last == rank - 1)) {
    a.dense = x.detach().contiguous();
    for (int64_t i = 0; i < first; ++i) a.outer *= shape[i];
    for (int64_t i = last + 1; i < rank; ++i) a.inner *= shape[i];
    return a;
  }
  Shape perm_shape, perm_strides;
  for (int pass = 0; pass < 2; ++pass)  // kept axes first, then reduced ones
    for (int64_t i = 0; i < rank; ++i)
      if (p.reduced[i] == (pass == 1)) {
        a.perm.push_back(i);
        perm_shape.push_back(shape[i]);
        perm_strides.push_back(x.strides()[i]);
        if (pass == 0) a.outer *= shape[i];
      }
  a.dense = x.detach().view_as_strided(perm_shape, perm_strides, x.impl()->offset).contiguous();
  return a;
}

// A dense tensor laid out like `a.dense`, seen in the input's axis order (a view).
Tensor unarrange(const Tensor& dense, const Arranged& a, const Shape& input_shape) {
  if (a.perm.empty()) return dense.view_as_strided(input_shape, contiguous_strides(input_shape), 0);
  const Shape dense_strides = contiguous_strides(dense.shape());
  Shape strides(input_shape.size());
  for (size_t pos = 0; pos < a.perm.size(); ++pos) strides[a.perm[pos]] = dense_strides[pos];
  return dense.view_as_strided(input_shape, strides, 0);
}

// out[o·inner + j] = Σ_r term(x[o, r, j], o·inner + j), in double.
//
// The order is fixed by the shape alone: the middle axis is cut into blocks of rows, each
// block is summed front to back (by four interleaved accumulators when inner = 1), and
// the block partials are added front to back. Blocks are the parallel tasks, so the
// result does not depend on the thread count.
template <class Term>
std::vector<double> sum_middle(const float* x, int64_t outer, int64_t count, int64_t inner, Term term) {
  const int64_t cols_per_block = std::min<int64_t>(std::max<int64_t>(inner, 1), 4096);
  const int64_t rows_per_block = inner == 1 ? kGrain : std::max<int64_t>(64, kGrain / cols_per_block);
  const int64_t row_blocks = std::max<int64_t>(1, (count + rows_per_block - 1) / rows_per_block);
  const int64_t col_blocks = (inner + cols_per_block - 1) / cols_per_block;
  std::vector<double> partial(static_cast<size_t>(outer * row_blocks * inner), 0.0);  // [outer, row_blocks, inner]

  const int64_t tasks = outer * row_blocks * col_blocks;
  const int64_t task_size = std::max<int64_t>(1, std::min(count, rows_per_block) * std::min(inner, cols_per_block));
  parallel_for(tasks, std::max<int64_t>(1, kGrain / task_size), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t cb = t % col_blocks, rb = (t / col_blocks) % row_blocks, o = t / (col_blocks * row_blocks);
      const int64_t r0 = rb * rows_per_block, r1 = std::min(count, r0 + rows_per_block);
      const int64_t j0 = cb * cols_per_block, j1 = std::min(inner, j0 + cols_per_block);
      double* acc = partial.data() + (o * row_blocks + rb) * inner;
      if (inner == 1) {
        const float* row = x + o * count;
        double s[4] = {0, 0, 0, 0};
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4)
          for (int k = 0; k < 4; ++k) s[k] += term(row[r + k], o);
        for (; r < r1; ++r) s[0] += term(row[r], o);
        acc[0] = (s[0] + s[1]) + (s[2] + s[3]);
      } else {
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = x + (o * count + r) * inner;
          for (int64_t j = j0; j < j1; ++j) acc[j] += term(row[j], o * inner + j);
        }
      }
    }
  });

  std::vector<double> out(static_cast<size_t>(outer * inner));
  parallel_for(outer * inner, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t o = k / inner, j = k % inner;
      double s = 0;
      for (int64_t rb = 0; rb < row_blocks; ++rb) s += partial[(o * row_blocks + rb) * inner + j];
      out[k] = s;
    }
  });
  return out;
}

Tensor to_tensor(const Shape& shape, const std::vector<double>& values, double scale) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data();
  for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<float>(values[i] * scale);
  return t;
}

// u (of a reduction's output) repeated over the reduced axes, densely, times `scale`.
Tensor spread(const Tensor& u, const Shape& keep_shape, const Shape& input_shape, float scale) {
  Tensor g = broadcast_to(reshape(u.contiguous(), keep_shape), input_shape).clone();
  if (scale != 1.0f) {
    float* p = g.data();
    parallel_for(g.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] *= scale;
    });
  }
  return g;
}

// sum and mean: u·scale spread back over the reduced axes (scale 1 or 1/count).
class SumNode : public Node {
public:
  SumNode(const char* name, Shape keep_shape, Shape input_shape, float scale)
      : name_(name), keep_shape_(std::move(keep_shape)), input_shape_(std::move(input_shape)), scale_(scale) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    return {spread(u, keep_shape_, input_shape_, scale_)};
  }

private:
  const char* name_;
  Shape keep_shape_, input_shape_;
  float scale_;
};

Tensor sum_or_mean(const char* name, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, bool average) {
  const Plan p = make_plan(name, x.shape(), axes, keepdim);
  const Arranged a = arrange(x, p, false);
  const std::vector<double> sums =
      sum_middle(a.dense.data(), a.outer, a.count, a.inner, [](float v, int64_t) { return double(v); });
  const double scale = average ? 1.0 / double(p.count) : 1.0;
  Tensor out = to_tensor(p.out_shape, sums, scale);
  if (needs_grad({x})) attach(out, std::make_shared<SumNode>(name, p.keep_shape, x.shape(), float(scale)), {x});
  return out;
}

// Σ(x−μ)²/(n−ddof): cotangent 2(x−μ)/(n−ddof)·u, μ saved from the forward pass.
class VarNode : public Node {
public:
  VarNode(Tensor x, Tensor mean, Shape keep_shape, double divisor)
      : x_(std::move(x)), mean_(std::move(mean)), keep_shape_(std::move(keep_shape)), divisor_(divisor) {}
  std::string name() const override { return "var"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    const Shape& shape = x_.shape();
    Tensor g = spread(u, keep_shape_, shape, float(2.0 / divisor_));
    const Tensor mu = broadcast_to(mean_, shape).contiguous();
    const Tensor x = x_.contiguous();
    float* pg = g.data();
    const float *px = x.data(), *pm = mu.data();
    parallel_for(g.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) pg[i] *= px[i] - pm[i];
    });
    return {g};
  }

private:
  Tensor x_, mean_;  // mean_ has keep_shape_
  Shape keep_shape_;
  double divisor_;
};

// max: the index of the first maximum of each output's elements, and the transport
// that routes u there (or spreads it, softly, under SoftPullback).
class MaxNode : public Node {
public:
  MaxNode(Tensor x, Plan plan, std::vector<int64_t> argmax)
      : x_(std::move(x)), plan_(std::move(plan)), argmax_(std::move(argmax)) {}
  std::string name() const override { return "max"; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport& transport) override {
    const Tensor u = cotangent.contiguous();
    const float* pu = u.data();
    const Arranged a = arrange(x_, plan_, true);
    Tensor g = Tensor::zeros(a.dense.shape());
    float* pg = g.data();
    const int64_t n = a.count;
    if (!transport.is_soft()) {
      for (int64_t o = 0; o < a.outer; ++o) pg[o * n + argmax_[o]] = pu[o];
    } else {
      // Fixed weights softmax(x/τ) over each output's elements (docs/methods.md §1.2, max-pool).
      const double tau = transport.tau.max_pool;
      const float* px = a.dense.data();
      parallel_for(a.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const float* row = px + o * n;
          float* out = pg + o * n;
          const double top = row[argmax_[o]];
          double total = 0;
          for (int64_t r = 0; r < n; ++r) total += out[r] = float(std::exp((row[r] - top) / tau));
          for (int64_t r = 0; r < n; ++r) out[r] = float(pu[o] * (out[r] / total));
        }
      });
    }
    return {unarrange(g, a, x_.shape())};
  }

private:
  Tensor x_;
  Plan plan_;
  std::vector<int64_t> argmax_;  // per output, the position of its maximum along `count`
};

}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  return sum_or_mean("sum", x, axes, keepdim, false);
}

Tensor mean(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  return sum_or_mean("mean", x, axes, keepdim, true);
}

Tensor var(const Tensor& x, std::vector<int64_t> axes, bool unbiased, bool keepdim) {
  const Plan p = make_plan("var", x.shape(), axes, keepdim);
  const Arranged a = arrange(x, p, false);
  const float* px = a.dense.data();
  const std::vector<double> sums =
      sum_middle(px, a.outer, a.count, a.inner, [](float v, int64_t) { return double(v); });
  std::vector<double> mu(sums.size());
  for (size_t k = 0; k < sums.size(); ++k) mu[k] = sums[k] / double(p.count);
  // Two passes (mean, then squared deviations) rather than E[x²]−E[x]²: no cancellation.
  const std::vector<double> squares = sum_middle(px, a.outer, a.count, a.inner, [&mu](float v, int64_t k) {
    const double d = double(v) - mu[k];
    return d * d;
  });
  const double divisor = double(p.count) - (unbiased ? 1.0 : 0.0);
  Tensor out = to_tensor(p.out_shape, squares, 1.0 / divisor);
  if (needs_grad({x})) {
    // mu is ordered by output, which matches keep_shape's row-major order.
    attach(out, std::make_shared<VarNode>(x.detach(), to_tensor(p.keep_shape, mu, 1.0), p.keep_shape, divisor), {x});
  }
  return out;
}

Tensor max(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  const Plan p = make_plan("max", x.shape(), axes, keepdim);
  check(p.count > 0, "max: cannot reduce over zero elements (input ", x.shape(), ")");
  const Arranged a = arrange(x, p, true);
  const float* px = a.dense.data();
  const int64_t n = a.count;
  std::vector<int64_t> argmax(static_cast<size_t>(a.outer));
  Tensor out = Tensor::empty(p.out_shape);
  float* po = out.data();
  parallel_for(a.outer, std::max<int64_t>(1, kGrain / n), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const float* row = px + o * n;
      int64_t best = 0;
      for (int64_t r = 1; r < n && !std::isnan(row[best]); ++r)
        if (row[r] > row[best] || std::isnan(row[r])) best = r;  // strict: ties keep the first
      argmax[o] = best;
      po[o] = row[best];
    }
  });
  if (needs_grad({x})) attach(out, std::make_shared<MaxNode>(x.detach(), p, std::move(argmax)), {x});
  return out;
}

}  // namespace adjoint
