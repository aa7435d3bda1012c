#include "engine/shape.h"

#include "engine/error.h"

namespace adjoint {

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) { return out << to_string(shape); }

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const char* who) {
  int64_t a = axis < 0 ? axis + rank : axis;
  check(a >= 0 && a < rank, who, ": axis ", axis, " is out of range for a tensor of rank ", rank);
  return a;
}

}  // namespace adjoint
