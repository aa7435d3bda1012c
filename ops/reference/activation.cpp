// Pointwise activations (ops/activation.h). Each is f(z) = z·g(z) for a gate g, and the
// transports differ only in the factor that multiplies the cotangent (docs/methods.md §1.2):
//
//   kind   f(z)     Gradient f'(z)            Pullback g(z)   SoftPullback g_soft(z/τ)
//   ReLU   z·1{z>0} 1{z>0}                    1{z>0}          Φ(z/τ)
//   GELU   z·Φ(z)   Φ(z) + z·φ(z)             Φ(z)            Φ(z/τ)
//   SiLU   z·σ(z)   σ(z) + z·σ(z)(1 − σ(z))   σ(z)            σ(z/τ)
//
// Guided Backprop multiplies f'(z) by max(u, 0); DeepLift's rescale rule multiplies the
// cotangents of an input and its baseline by (f(z) − f(z0))/(z − z0).
#include <cmath>

#include "engine/error.h"
#include "ops/reference/reference.h"

namespace adjoint::reference {

namespace {

double Phi(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }  // standard normal CDF
double phi(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); }  // its density
double sigma(double z) { return 1.0 / (1.0 + std::exp(-z)); }  // logistic function

// One row of the table above.
struct Rule {
  double (*gate)(double z);       // g: f(z) = z·g(z), the pullback's frozen gate
  double (*derivative)(double z);  // f'
  double (*soft_gate)(double s);  // applied to s = z/τ
  float Temperatures::*tau;       // which temperature softens it
};

double step(double z) { return z > 0 ? 1.0 : 0.0; }
double gelu_derivative(double z) { return Phi(z) + z * phi(z); }
double silu_derivative(double z) { return sigma(z) + z * sigma(z) * (1 - sigma(z)); }

Rule rule(Activation kind) {
  switch (kind) {
    case Activation::Relu: return {step, step, Phi, &Temperatures::relu};
    case Activation::Gelu: return {Phi, gelu_derivative, Phi, &Temperatures::gelu};
    case Activation::Silu: return {sigma, silu_derivative, sigma, &Temperatures::silu};
  }
  throw Error("reference activation: unknown kind");
}

double f(const Rule& r, double z) { return z * r.gate(z); }

}  // namespace

// f(z) = z·g(z), elementwise.
Values activation_forward(const Values& z, Activation kind) {
  const Rule r = rule(kind);
  Values y(z.size());
  for (size_t i = 0; i < z.size(); ++i) y[i] = f(r, z[i]);
  return y;
}

// The column of the table for transport t (docs/methods.md §1.2).
Values activation_backward(const Values& u, const Values& z, Activation kind, const Transport& t) {
  const Rule r = rule(kind);
  Values dz(z.size());
  const size_t half = z.size() / 2;  // DeepLift: input i pairs with baseline i + half
  for (size_t i = 0; i < z.size(); ++i) {
    switch (t.kind) {
      case TransportKind::Gradient: dz[i] = r.derivative(z[i]) * u[i]; break;
      case TransportKind::Pullback: dz[i] = r.gate(z[i]) * u[i]; break;
      case TransportKind::SoftPullback: dz[i] = r.soft_gate(z[i] / double(t.tau.*r.tau)) * u[i]; break;
      case TransportKind::Guided: dz[i] = r.derivative(z[i]) * std::max(u[i], 0.0); break;
      case TransportKind::DeepLift: {
        const double x = z[i < half ? i : i - half], x0 = z[i < half ? i + half : i];
        // The secant slope; where input and baseline (nearly) coincide, the tangent's.
        const double m = std::fabs(x - x0) < 1e-6 ? r.derivative(z[i]) : (f(r, x) - f(r, x0)) / (x - x0);
        dz[i] = m * u[i];
        break;
      }
    }
  }
  return dz;
}

}  // namespace adjoint::reference
