// Between the engine's float tensors and the reference ops' double arrays.
#include "ops/reference/reference.h"

namespace adjoint::reference {

Values values(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector();
  return Values(v.begin(), v.end());
}

Tensor to_tensor(const Shape& shape, const Values& v) {
  return Tensor::from_vector(shape, std::vector<float>(v.begin(), v.end()));
}

}  // namespace adjoint::reference
