// Checks an op against a case of a fixture written by record() in gen_conv.py: inputs
// "<case>.in<i>", forward output "<case>.out" and, for the cotangent "<case>.u", the
// input cotangents "<case>.grad<i>" under the Gradient transport.
#pragma once
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/autograd.h"
#include "tests/support.h"

namespace adjoint::testing {

inline std::vector<Tensor> golden_inputs(const std::string& fixture_name, const std::string& name, int count) {
  std::vector<Tensor> inputs;
  for (int i = 0; i < count; ++i) inputs.push_back(golden(fixture_name, name + ".in" + std::to_string(i)));
  return inputs;
}

inline void check_golden_case(const std::string& fixture_name, const std::string& name, int inputs, const Fn& f,
                              double rtol = 1e-4, double atol = 1e-5) {
  INFO("golden case ", name);
  const std::vector<Tensor> primals = golden_inputs(fixture_name, name, inputs);
  Tensor y;
  {
    NoGrad no_grad;
    y = f(primals);
  }
  check_close(y, golden(fixture_name, name + ".out"), rtol, atol, name + " forward");
  const std::vector<Tensor> grads = vjp(f, primals, golden(fixture_name, name + ".u"));
  for (int i = 0; i < inputs; ++i)
    check_close(grads[i], golden(fixture_name, name + ".grad" + std::to_string(i)), rtol, atol,
                name + " cotangent of input " + std::to_string(i));
}

}  // namespace adjoint::testing
