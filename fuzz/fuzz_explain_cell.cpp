// A cell file of `adjoint explain --evaluate` (analysis/pullbacks/cells.h): parse and
// validate; a cell that reads must write and read back to the same images, scores (bit for
// bit, NaN for NaN), pictures and record.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "analysis/pullbacks/cells.h"
#include "engine/error.h"

namespace {

bool same_bits(double a, double b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  adjoint::ImageCell cell;
  try {
    cell = adjoint::read_image_cell_text(text, "cell.json");
  } catch (const adjoint::Error&) {
    return 0;
  }
  const adjoint::ImageCell back = adjoint::read_image_cell_text(adjoint::image_cell_text(cell), "again.json");
  if (!(back.images == cell.images) || back.piece != cell.piece || back.files != cell.files || back.made != cell.made)
    std::abort();
  if (back.scores.size() != cell.scores.size()) std::abort();
  for (const auto& [method, metrics] : cell.scores)
    for (const auto& [metric, values] : metrics) {
      const std::vector<double>& again = back.scores.at(method).at(metric);
      if (again.size() != values.size()) std::abort();
      for (size_t k = 0; k < values.size(); ++k)
        if (!same_bits(again[k], values[k])) std::abort();
    }
  return 0;
}
