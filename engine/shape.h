// Shapes and the index arithmetic every op shares.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace adjoint {

using Shape = std::vector<int64_t>;

// "[2, 3, 4]": the form every error message uses.
std::string to_string(const Shape& shape);
std::ostream& operator<<(std::ostream& out, const Shape& shape);

// Product of the extents (1 for a scalar).
int64_t numel(const Shape& shape);

// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

// Maps a possibly negative axis into [0, rank); `who` names the caller in the error.
int64_t normalize_axis(int64_t axis, int64_t rank, const char* who);

}  // namespace adjoint
