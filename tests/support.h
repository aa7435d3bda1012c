// Shared test machinery: finite-difference gradient checks, PyTorch golden fixtures,
// and tensor comparison with a readable failure message.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "engine/tensor.h"
#include "engine/transport.h"

namespace adjoint::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCheckOptions {
  double eps = 1e-2;   // central-difference step (inputs are float32)
  double rtol = 2e-2;  // |analytic - numeric| <= atol + rtol * |numeric|, elementwise
  double atol = 2e-3;
  uint64_t seed = 1234;  // seeds the random cotangent
};

// Checks the Gradient transport of f at `inputs` against central differences of
// ⟨u, f(x)⟩ with a random cotangent u, accumulated in double. Fails (doctest CHECK) on
// any mismatch and when the numerical gradient of an input is identically zero.
// Only the inputs flagged in `check_input` (default all) are perturbed.
void check_gradients(const Fn& f, const std::vector<Tensor>& inputs, GradCheckOptions options = {},
                     std::vector<bool> check_input = {});

// The fixture tests/goldens/<name>.safetensors, read once per process.
const SafetensorsFile& fixture(const std::string& name);
// A tensor of a fixture, with an error naming the fixture and tensor when missing.
Tensor golden(const std::string& fixture_name, const std::string& tensor_name);

// CHECKs that `actual` matches `expected` in shape and, elementwise, within
// atol + rtol·|expected|; the message names `what` and the worst element.
void check_close(const Tensor& actual, const Tensor& expected, double rtol, double atol, const std::string& what);

// A random tensor with entries in [lo, hi) from a seeded generator.
Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

}  // namespace adjoint::testing
