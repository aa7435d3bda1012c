// Numbers in CSV files. A spreadsheet or pandas reads "nan" and "inf" as floats, while
// the C++ stream's "-nan" (NaN with its sign bit set) is read as text: one spelling for
// every CSV the engine writes.
#pragma once
#include <cmath>
#include <string>

#include "engine/error.h"

namespace adjoint {

inline std::string csv_number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return cat(x);
}

}  // namespace adjoint
