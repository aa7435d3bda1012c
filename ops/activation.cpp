#include "ops/activation.h"

#include <algorithm>
#include <cmath>

#include "engine/autograd.h"
#include "engine/threads.h"

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

float normal_cdf(float z) { return 0.5f * std::erfc(-z * static_cast<float>(M_SQRT1_2)); }
float normal_pdf(float z) { return std::exp(-0.5f * z * z) * static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2); }
float logistic(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// out[i] = fn(z[i]). A template so that each activation's loop is compiled (and
// vectorised) on its own rather than dispatching on the kind per element.
template <class Fn>
Tensor map_elements(const Tensor& z, Fn fn) {
  Tensor out = Tensor::empty(z.shape());
  const float* pz = z.data();
  float* po = out.data();
  parallel_for(z.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = fn(pz[i]);
  });
  return out;
}

// out[i] = factor(z[i]) · u[i]: every transport of a pointwise activation has this form.
template <class Factor>
Tensor scale_cotangent(const Tensor& z, const Tensor& u, Factor factor) {
  Tensor out = Tensor::empty(z.shape());
  const float *pz = z.data(), *pu = u.data();
  float* po = out.data();
  parallel_for(z.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = factor(pz[i]) * pu[i];
  });
  return out;
}

Tensor forward(const Tensor& z, Activation kind) {
  switch (kind) {
    case Activation::Relu: return map_elements(z, [](float v) { return std::max(v, 0.0f); });  // keeps NaN
    case Activation::Gelu: return map_elements(z, [](float v) { return v * normal_cdf(v); });
    case Activation::Silu: return map_elements(z, [](float v) { return v * logistic(v); });
  }
  return {};
}

// The table in activation.h, row by row.
Tensor transport(const Tensor& z, const Tensor& u, Activation kind, const Transport& t) {
  switch (kind) {
    case Activation::Relu: {
      if (t.is_soft()) {
        const float inv_tau = 1.0f / t.tau.relu;
        return scale_cotangent(z, u, [=](float v) { return normal_cdf(v * inv_tau); });
      }
      // The gate is the derivative, so gradient and pullback coincide.
      return scale_cotangent(z, u, [](float v) { return v > 0 ? 1.0f : 0.0f; });
    }
    case Activation::Gelu: {
      if (t.is_soft()) {
        const float inv_tau = 1.0f / t.tau.gelu;
        return scale_cotangent(z, u, [=](float v) { return normal_cdf(v * inv_tau); });
      }
      if (!t.is_gradient()) return scale_cotangent(z, u, [](float v) { return normal_cdf(v); });
      return scale_cotangent(z, u, [](float v) { return normal_cdf(v) + v * normal_pdf(v); });
    }
    case Activation::Silu: {
      if (t.is_soft()) {
        const float inv_tau = 1.0f / t.tau.silu;
        return scale_cotangent(z, u, [=](float v) { return logistic(v * inv_tau); });
      }
      if (!t.is_gradient()) return scale_cotangent(z, u, [](float v) { return logistic(v); });
      return scale_cotangent(z, u, [](float v) {
        const float s = logistic(v);
        return s + v * s * (1.0f - s);
      });
    }
  }
  return {};
}

// One node type for every activation: it keeps the pre-activation z and the kind.
class ActivationNode : public Node {
public:
  ActivationNode(Tensor z, Activation kind) : z_(std::move(z)), kind_(kind) {}
  std::string name() const override { return to_string(kind_); }
  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override { return {transport(z_, u, kind_, t)}; }

private:
  Tensor z_;  // the input's values, detached
  Activation kind_;
};

}  // namespace

Tensor activation(const Tensor& x, Activation kind) {
  Tensor z = x.contiguous();
  Tensor out = forward(z, kind);
  if (needs_grad({z})) attach(out, std::make_shared<ActivationNode>(z.detach(), kind), {z});
  return out;
}

Tensor relu(const Tensor& x) { return activation(x, Activation::Relu); }
Tensor gelu(const Tensor& x) { return activation(x, Activation::Gelu); }
Tensor silu(const Tensor& x) { return activation(x, Activation::Silu); }

}  // namespace adjoint
