#include "ops/activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/fast_exp.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/elementwise.h"

namespace adjoint {

const char* to_string(Activation kind) {
  switch (kind) {
    case Activation::Relu: return "relu";
    case Activation::Gelu: return "gelu";
    case Activation::Silu: return "silu";
  }
  return "?";
}

namespace {

// Elements per parallel chunk: enough work to amortise a task, small enough to balance.
constexpr int64_t kGrain = 1 << 14;

// Φ, evaluated once or twice per element of every GELU and every soft gate, so its cost
// is a large share of a ViT step and of every soft pullback. std::erfc is a libm call
// whose loops do not vectorise (what it cost: docs/benchmarks.md). This is a rational approximation of erf on [−4, 4]
// (the coefficients of Eigen's generic_fast_erf_float; beyond ±4 erf is ±1 in float32):
// no branch and no libm call, so the loop vectorises. Each Horner step is one fused
// multiply-add (engine/fast_exp.h says why that is the same bits everywhere and where it is
// fast): half the instructions of separate products and sums. The one division costs
// about as much as the Newton steps that would replace it. |error| < 2.5e-7 in Φ
// (tests/test_activation.cpp sweeps the floats), which is as close as float32 resolves
// a gate near 1.
[[gnu::always_inline]] inline float fast_normal_cdf(float z) {
  const float x = std::clamp(z * static_cast<float>(M_SQRT1_2), -4.0f, 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;  // odd numerator, by Horner in x²
  p = std::fma(p, x2, 2.77068142495902e-08f);
  p = std::fma(p, x2, -2.10102402082508e-06f);
  p = std::fma(p, x2, -5.69250639462346e-05f);
  p = std::fma(p, x2, -7.34990630326855e-04f);
  p = std::fma(p, x2, -2.95459980854025e-03f);
  p = std::fma(p, x2, -1.60960333262415e-02f);
  float q = -1.45660718464996e-05f;  // even denominator
  q = std::fma(q, x2, -2.13374055278905e-04f);
  q = std::fma(q, x2, -1.68282697438203e-03f);
  q = std::fma(q, x2, -7.37332916720468e-03f);
  q = std::fma(q, x2, -1.42647390514189e-02f);
  return std::fma(0.5f, x * p / q, 0.5f);
}

// φ(z), by the exp of engine/fast_exp.h.
[[gnu::always_inline]] inline float normal_pdf(float z) {
  return fast_exp_fused(-0.5f * z * z) * static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2);
}

[[gnu::always_inline]] inline float logistic(float z) { return 1.0f / (1.0f + fast_exp_fused(-z)); }

// The rule table: each activation as f(z) = z·g(z), with its derivative, the frozen gate g
// of the pullback and the gate that the soft pullback applies to z/τ. Static functions
// so that every loop below is compiled (and vectorised) for one activation at a time.
// The cotangent w times f'(z) and times g(z): the smooth rules multiply.
template <class Rule>
struct Multiplies {
  static float times_derivative(float z, float w) { return Rule::derivative(z) * w; }
  static float times_gate(float z, float w) { return Rule::gate(z) * w; }
};

struct ReluRule {
  static float value(float z) { return relu_value(z); }
  // Derivative and gate are both the step [z > 0], applied as a select (activation.h).
  static float times_derivative(float z, float w) { return relu_gate(z, w); }
  static float times_gate(float z, float w) { return times_derivative(z, w); }
  static float soft_gate(float s) { return fast_normal_cdf(s); }
  static float temperature(const Temperatures& t) { return t.relu; }
};
struct GeluRule : Multiplies<GeluRule> {
  static float value(float z) { return z * fast_normal_cdf(z); }
  // Φ(z) + z·φ(z). Beyond |z| = 13 the second term is below 1e-36, so z is clamped there
  // in it: it then vanishes for every huge z, as it should (a huge z times the density
  // that the exp's own clamp keeps above 0 would not, and ±inf would give ±inf).
  static float derivative(float z) {
    const float zc = std::clamp(z, -13.0f, 13.0f);
    return std::fma(zc, normal_pdf(zc), fast_normal_cdf(z));
  }
  static float gate(float z) { return fast_normal_cdf(z); }
  static float soft_gate(float s) { return fast_normal_cdf(s); }
  static float temperature(const Temperatures& t) { return t.gelu; }
};
struct SiluRule : Multiplies<SiluRule> {
  static float value(float z) { return z * logistic(z); }
  static float derivative(float z) {
    const float s = logistic(z);
    return std::fma(z * s, 1.0f - s, s);
  }
  static float gate(float z) { return logistic(z); }
  static float soft_gate(float s) { return logistic(s); }
  static float temperature(const Temperatures& t) { return t.silu; }
};

// Calls body(Rule{}) with the rule of `kind`.
template <class Body>
auto with_rule(Activation kind, Body body) {
  switch (kind) {
    case Activation::Relu: return body(ReluRule{});
    case Activation::Gelu: return body(GeluRule{});
    case Activation::Silu: return body(SiluRule{});
  }
  throw Error(cat("activation: unknown kind ", static_cast<int>(kind)));
}

// out[i] = fn(z[i]).
template <class Fn>
Tensor map_elements(const Tensor& z, Fn fn) {
  Tensor out = Tensor::empty(z.shape());
  const float* __restrict pz = z.data();
  float* __restrict po = out.data();
  parallel_for(z.numel(), kGrain, [&](int64_t b, int64_t e) {
    run_widest([&] {  // GELU's and SiLU's erf and exp are compute-bound: AVX2 halves them
      for (int64_t i = b; i < e; ++i) po[i] = fn(pz[i]);
    });
  });
  return out;
}

// out[i] = fn(z[i], u[i]): every transport but DeepLift is a pointwise function of the
// pre-activation and the cotangent (and add_relu one of its two summands).
template <class Fn>
Tensor map_pairs(const Tensor& z, const Tensor& u, Fn fn) {
  Tensor out = Tensor::empty(z.shape());
  const float *__restrict pz = z.data(), *__restrict pu = u.data();
  float* __restrict po = out.data();
  parallel_for(z.numel(), kGrain, [&](int64_t b, int64_t e) {
    run_widest([&] {
      for (int64_t i = b; i < e; ++i) po[i] = fn(pz[i], pu[i]);
    });
  });
  return out;
}

// Below this |z − z0| the rescale multiplier is numerically meaningless and DeepLift
// falls back to the gradient (as Captum does, with a smaller threshold of its own).
constexpr float kRescaleEpsilon = 1e-6f;

// DeepLift's rescale rule. z holds the batch [x; x0]: row i (an input) and row i+N (its
// baseline) share the multiplier m = (f(z)−f(z0))/(z−z0), and each row's cotangent is
// multiplied by it.
template <class Rule>
Tensor rescale_cotangent(const Tensor& z, const Tensor& u, Activation kind) {
  check(z.dim() >= 1 && z.size(0) % 2 == 0, to_string(kind),
        ": the DeepLift transport needs the batch [inputs; baselines] (an even leading axis), got ", z.shape());
  Tensor out = Tensor::empty(z.shape());
  const int64_t half = z.numel() / 2;  // rows i < N fill the first half of the storage
  const float *pz = z.data(), *pu = u.data();
  float* po = out.data();
  parallel_for(half, kGrain, [&](int64_t b, int64_t e) {
    run_widest([&] {  // the rules' fused multiply-adds are instructions only there (engine/fast_exp.h)
      for (int64_t i = b; i < e; ++i) {
        const float x = pz[i], x0 = pz[i + half];
        const float dx = x - x0;
        if (std::fabs(dx) < kRescaleEpsilon) {
          po[i] = Rule::times_derivative(x, pu[i]);
          po[i + half] = Rule::times_derivative(x0, pu[i + half]);
        } else {
          const float m = (Rule::value(x) - Rule::value(x0)) / dx;
          po[i] = m * pu[i];
          po[i + half] = m * pu[i + half];
        }
      }
    });
  });
  return out;
}

Tensor forward(const Tensor& z, Activation kind) {
  return with_rule(kind, [&](auto rule) { return map_elements(z, [](float v) { return decltype(rule)::value(v); }); });
}

// The tables in activation.h, column by column.
Tensor transport(const Tensor& z, const Tensor& u, Activation kind, const Transport& t) {
  return with_rule(kind, [&](auto rule) -> Tensor {
    using Rule = decltype(rule);
    switch (t.kind) {
      case TransportKind::Gradient:
        return map_pairs(z, u, [](float v, float w) { return Rule::times_derivative(v, w); });
      case TransportKind::Pullback:
        return map_pairs(z, u, [](float v, float w) { return Rule::times_gate(v, w); });
      case TransportKind::SoftPullback: {
        const float tau = Rule::temperature(t.tau);
        check(tau > 0, to_string(kind), ": soft pullback temperature must be positive, got ", tau);
        const float inv_tau = 1.0f / tau;
        return map_pairs(z, u, [=](float v, float w) { return Rule::soft_gate(v * inv_tau) * w; });
      }
      case TransportKind::Guided:
        return map_pairs(z, u, [](float v, float w) { return Rule::times_derivative(v, std::max(w, 0.0f)); });
      case TransportKind::DeepLift:
        return rescale_cotangent<Rule>(z, u, kind);
    }
    throw Error(cat(to_string(kind), ": unknown transport ", to_string(t.kind)));
  });
}

// One node type for every activation: it keeps the pre-activation z and the kind.
// Under GradientOnly a ReLU keeps its output y instead: y > 0 exactly where z > 0, which is
// all the gradient, the pullback and guided backprop read, and y is kept alive by the
// next op anyway (PyTorch's in-place ReLU saves the same tensor).
class ActivationNode : public Node {
public:
  ActivationNode(Tensor saved, Activation kind, bool saved_output)
      : saved_(std::move(saved)), kind_(kind), saved_output_(saved_output) {}
  std::string name() const override { return to_string(kind_); }
  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    check(!saved_output_ || t.kind == TransportKind::Gradient || t.kind == TransportKind::Pullback ||
              t.kind == TransportKind::Guided,
          to_string(kind_), ": this graph was recorded under GradientOnly (a training step), which keeps only the ",
          to_string(kind_), "'s output; the ", to_string(t.kind),
          " transport needs its input, so record the forward outside GradientOnly");
    return {transport(saved_, u, kind_, t)};
  }
  void release() override { saved_ = Tensor(); }

private:
  Tensor saved_;       // the input z, or the output y of a ReLU recorded under GradientOnly; detached
  Activation kind_;
  bool saved_output_;
};

}  // namespace

void record_activation(const Tensor& z, const Tensor& y, Activation kind) {
  if (!needs_grad({z})) return;
  const bool keep_output = kind == Activation::Relu && recording_gradient_only();
  Tensor out = y;
  attach(out, std::make_shared<ActivationNode>((keep_output ? y : z).detach(), kind, keep_output), {z});
}

Tensor activation(const Tensor& x, Activation kind) {
  Tensor z = x.contiguous();
  Tensor out = forward(z, kind);
  record_activation(z, out, kind);
  return out;
}

void activation_values(const float* z, float* y, int64_t n, Activation kind) {
  with_rule(kind, [&](auto rule) {
    run_widest([&] {
      for (int64_t i = 0; i < n; ++i) y[i] = decltype(rule)::value(z[i]);
    });
  });
}

void activation_values_and_derivatives(const float* z, float* y, float* d, int64_t n, Activation kind) {
  check(kind != Activation::Relu, "activation_values_and_derivatives: ReLU's gradient selects, it does not multiply");
  with_rule(kind, [&](auto rule) {
    using Rule = decltype(rule);
    if constexpr (requires { Rule::derivative(0.0f); })
      run_widest([&] {
        for (int64_t i = 0; i < n; ++i) {
          const float v = z[i];
          y[i] = Rule::value(v), d[i] = Rule::derivative(v);
        }
      });
  });
}

Tensor activation_vjp(const Tensor& z, const Tensor& u, Activation kind, const Transport& t) {
  return transport(z.contiguous(), u.contiguous(), kind, t);
}

Tensor relu(const Tensor& x) { return activation(x, Activation::Relu); }

Tensor add_relu(const Tensor& a, const Tensor& b) {
  if (needs_grad({a, b}) || a.shape() != b.shape()) return relu(a + b);
  // The float operations of the separate ops, in their order: the same bits.
  return map_pairs(a.contiguous(), b.contiguous(), [](float x, float y) { return ReluRule::value(x + y); });
}
Tensor gelu(const Tensor& x) { return activation(x, Activation::Gelu); }
Tensor silu(const Tensor& x) { return activation(x, Activation::Silu); }

}  // namespace adjoint
