// Checks an op against a case of the math fixture (tests/goldens/gen_math.py): forward
// output "<case>.y" and, for cotangent "<case>.u", the input cotangents "<case>.g<input>".
#pragma once
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "tests/support.h"

namespace adjoint::testing {

inline Tensor math_golden(const std::string& name) { return golden("math", name); }

inline void check_math_case(const std::string& name, const std::vector<std::string>& inputs, const Fn& f,
                            double rtol = 1e-4, double atol = 1e-5) {
  INFO("golden case ", name);
  std::vector<Tensor> primals;
  for (const std::string& in : inputs) primals.push_back(math_golden(name + "." + in));
  Tensor y;
  {
    NoGrad no_grad;
    y = f(primals);
  }
  check_close(y, math_golden(name + ".y"), rtol, atol, name + " forward");
  const std::vector<Tensor> grads = vjp(f, primals, math_golden(name + ".u"));
  for (size_t i = 0; i < inputs.size(); ++i)
    check_close(grads[i], math_golden(name + ".g" + inputs[i]), rtol, atol, name + " cotangent of " + inputs[i]);
}

// Integer data stored as float32 in the fixture (labels, indices).
inline std::vector<int64_t> math_golden_indices(const std::string& name) {
  std::vector<int64_t> out;
  for (float v : math_golden(name).to_vector()) out.push_back(static_cast<int64_t>(v));
  return out;
}

}  // namespace adjoint::testing
