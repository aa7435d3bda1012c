// Elementwise ops: one forward kernel helper per arity and one node for all of them.
//
// An elementwise op y = f(x) or y = f(a, b) transports u to u·∂f/∂input, elementwise.
// Each op states its partial derivatives as a small rule over two saved operands
// (the input and output for unary ops, the two inputs for binary ops); the single
// ElementwiseNode applies those rules. Smooth maps: one rule for all three transports.
#include "ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

// Elements per parallel chunk: large enough that scheduling costs nothing next to the work.
constexpr int64_t kGrain = 16384;

// g[i] = u[i]·∂f/∂input(first[i], second[i]) over one chunk of n elements.
using ChunkRule = std::function<void(const float* first, const float* second, const float* u, float* g, int64_t n)>;

// One partial derivative of an elementwise op: a constant slope (affine in that input),
// or a rule over the saved operands.
struct Partial {
  float slope = 1.0f;  // used when `rule` is empty
  ChunkRule rule;

  static Partial constant(float slope) { return {slope, {}}; }
  // `d(first, second)` is the derivative at one element; inlined into the chunk loop.
  template <class D>
  static Partial of(D d) {
    return {0.0f, [d](const float* p, const float* q, const float* u, float* g, int64_t n) {
              for (int64_t i = 0; i < n; ++i) g[i] = u[i] * d(p[i], q[i]);
            }};
  }
};

class ElementwiseNode : public Node {
public:
  // `first` and `second` are the saved operands the partials read (undefined when none does).
  ElementwiseNode(std::string name, Tensor first, Tensor second, std::vector<Partial> partials)
      : name_(std::move(name)), first_(std::move(first)), second_(std::move(second)), partials_(std::move(partials)) {}

  std::string name() const override { return name_; }

  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override {
    const Tensor u = cotangent.contiguous();
    std::vector<Tensor> result(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (needs[i]) result[i] = apply(partials_[i], u);
    return result;
  }

private:
  Tensor apply(const Partial& partial, const Tensor& u) const {
    // A slope of 1 passes the cotangent on. A fresh handle (detach) makes the engine copy
    // before it accumulates into it, so two inputs never share one buffer by accident.
    if (!partial.rule && partial.slope == 1.0f) return u.detach();
    Tensor g = Tensor::empty(u.shape());
    const float* pu = u.data();
    float* pg = g.data();
    if (!partial.rule) {
      const float slope = partial.slope;
      parallel_for(u.numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) pg[i] = slope * pu[i];
      });
      return g;
    }
    // An operand no rule reads is not saved; u stands in so the pointers stay valid.
    const float* p = first_.defined() ? first_.data() : pu;
    const float* q = second_.defined() ? second_.data() : pu;
    parallel_for(u.numel(), kGrain,
                 [&](int64_t b, int64_t e) { partial.rule(p + b, q + b, pu + b, pg + b, e - b); });
    return g;
  }

  void release() override { first_ = second_ = Tensor(); }

  std::string name_;
  Tensor first_, second_;
  std::vector<Partial> partials_;
};

// Which forward values a unary op's derivative reads: only those are kept alive.
enum class Reads { Nothing, Input, Output, Both };

// y = f(x) elementwise, recorded with derivative rule `partial` over (x, y).
template <class F>
Tensor unary(const char* name, const Tensor& input, F f, Reads reads, Partial partial) {
  const Tensor x = input.contiguous();
  Tensor y = Tensor::empty(x.shape());
  const float* px = x.data();
  float* py = y.data();
  parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) py[i] = f(px[i]);
  });
  if (needs_grad({x})) {
    const bool in = reads == Reads::Input || reads == Reads::Both;
    const bool out = reads == Reads::Output || reads == Reads::Both;
    attach(y,
           std::make_shared<ElementwiseNode>(name, in ? x.detach() : Tensor(), out ? y.detach() : Tensor(),
                                             std::vector<Partial>{std::move(partial)}),
           {x});
  }
  return y;
}

// c = f(a, b) elementwise for equal shapes, recorded with one partial per input over (a, b).
template <class F>
Tensor binary(const char* name, const Tensor& a_in, const Tensor& b_in, F f, bool reads_operands, Partial da,
              Partial db) {
  check(a_in.shape() == b_in.shape(), name, ": shapes ", a_in.shape(), " and ", b_in.shape(),
        " differ; elementwise ops do not broadcast, use broadcast_to(x, shape) first");
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor c = Tensor::empty(a.shape());
  const float *pa = a.data(), *pb = b.data();
  float* pc = c.data();
  parallel_for(a.numel(), kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) pc[i] = f(pa[i], pb[i]);
  });
  if (needs_grad({a, b}))
    attach(c,
           std::make_shared<ElementwiseNode>(name, reads_operands ? a.detach() : Tensor(),
                                             reads_operands ? b.detach() : Tensor(),
                                             std::vector<Partial>{std::move(da), std::move(db)}),
           {a, b});
  return c;
}

// The logistic function without overflow: exp of a non-positive number only,
// e = exp(−|v|), σ(v) = 1/(1+e) for v ≥ 0 and e/(1+e) below. Branch-free.
float logistic(float v) {
  const float e = std::exp(-std::fabs(v));
  const float r = 1.0f / (1.0f + e);
  return v >= 0 ? r : e * r;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", a, b, [](float x, float y) { return x + y; }, false, Partial::constant(1),
                Partial::constant(1));
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary("sub", a, b, [](float x, float y) { return x - y; }, false, Partial::constant(1),
                Partial::constant(-1));
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary("mul", a, b, [](float x, float y) { return x * y; }, true,
                Partial::of([](float, float y) { return y; }), Partial::of([](float x, float) { return x; }));
}
Tensor div(const Tensor& a, const Tensor& b) {
  // ∂(a/b)/∂b = −a/b², written as PyTorch does so that the goldens agree to the last bit.
  return binary("div", a, b, [](float x, float y) { return x / y; }, true,
                Partial::of([](float, float y) { return 1.0f / y; }),
                Partial::of([](float x, float y) { return -x / (y * y); }));
}

Tensor neg(const Tensor& x) {
  return unary("neg", x, [](float v) { return -v; }, Reads::Nothing, Partial::constant(-1));
}
Tensor exp(const Tensor& x) {
  return unary("exp", x, [](float v) { return std::exp(v); }, Reads::Output,
               Partial::of([](float, float y) { return y; }));
}
Tensor log(const Tensor& x) {
  return unary("log", x, [](float v) { return std::log(v); }, Reads::Input,
               Partial::of([](float v, float) { return 1.0f / v; }));
}
Tensor sqrt(const Tensor& x) {
  return unary("sqrt", x, [](float v) { return std::sqrt(v); }, Reads::Output,
               Partial::of([](float, float y) { return 0.5f / y; }));
}
Tensor abs(const Tensor& x) {
  // sign(x), with 0 at the kink as in PyTorch.
  return unary("abs", x, [](float v) { return std::fabs(v); }, Reads::Input,
               Partial::of([](float v, float) { return v > 0 ? 1.0f : (v < 0 ? -1.0f : 0.0f); }));
}
Tensor sigmoid(const Tensor& x) {
  return unary("sigmoid", x, [](float v) { return logistic(v); }, Reads::Output,
               Partial::of([](float, float y) { return y * (1.0f - y); }));
}
Tensor tanh(const Tensor& x) {
  return unary("tanh", x, [](float v) { return std::tanh(v); }, Reads::Output,
               Partial::of([](float, float y) { return 1.0f - y * y; }));
}
Tensor pow(const Tensor& x, float exponent) {
  // p·x^(p−1); for p = 0 the derivative is 0 everywhere (also at x = 0, where x^(−1) is inf).
  return unary("pow", x, [exponent](float v) { return std::pow(v, exponent); }, Reads::Input,
               Partial::of([exponent](float v, float) {
                 return exponent == 0.0f ? 0.0f : exponent * std::pow(v, exponent - 1.0f);
               }));
}
Tensor clamp(const Tensor& x, float lo, float hi) {
  check(lo <= hi, "clamp: lower bound ", lo, " exceeds upper bound ", hi, " (input ", x.shape(), ")");
  // The gate 1{lo ≤ x ≤ hi}: inclusive at the bounds, as PyTorch.
  return unary("clamp", x, [lo, hi](float v) { return std::min(std::max(v, lo), hi); }, Reads::Input,
               Partial::of([lo, hi](float v, float) { return v >= lo && v <= hi ? 1.0f : 0.0f; }));
}
Tensor add_scalar(const Tensor& x, float c) {
  return unary("add_scalar", x, [c](float v) { return v + c; }, Reads::Nothing, Partial::constant(1));
}
Tensor mul_scalar(const Tensor& x, float c) {
  return unary("mul_scalar", x, [c](float v) { return v * c; }, Reads::Nothing, Partial::constant(c));
}

namespace {
// x / c and c / x as true divisions (not multiplication by a rounded reciprocal).
Tensor div_scalar(const Tensor& x, float c) {
  return unary("div_scalar", x, [c](float v) { return v / c; }, Reads::Nothing, Partial::constant(1.0f / c));
}
Tensor scalar_div(float c, const Tensor& x) {
  // ∂(c/x)/∂x = −c/x² = −y/x.
  return unary("scalar_div", x, [c](float v) { return c / v; }, Reads::Both,
               Partial::of([](float v, float y) { return -y / v; }));
}
}  // namespace

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, float c) { return add_scalar(a, c); }
Tensor operator-(const Tensor& a, float c) { return add_scalar(a, -c); }
Tensor operator*(const Tensor& a, float c) { return mul_scalar(a, c); }
Tensor operator/(const Tensor& a, float c) { return div_scalar(a, c); }
Tensor operator+(float c, const Tensor& a) { return add_scalar(a, c); }
Tensor operator-(float c, const Tensor& a) {
  return unary("rsub_scalar", a, [c](float v) { return c - v; }, Reads::Nothing, Partial::constant(-1));
}
Tensor operator*(float c, const Tensor& a) { return mul_scalar(a, c); }
Tensor operator/(float c, const Tensor& a) { return scalar_div(c, a); }
Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace adjoint
