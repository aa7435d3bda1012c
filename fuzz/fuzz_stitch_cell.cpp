// A stitching sweep's cell file (analysis/stitching/records.h): parse and validate; a cell
// that reads must write and read back to the same key and record.
#include <cstdlib>
#include <string>

#include "analysis/stitching/records.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  adjoint::StitchCell cell;
  try {
    cell = adjoint::read_cell_text(text, "cell.json");
  } catch (const adjoint::Error&) {
    return 0;
  }
  const adjoint::StitchCell back = adjoint::read_cell_text(adjoint::to_json(adjoint::cell_to_json(cell)), "again.json");
  if (back.key() != cell.key() || back.made != cell.made || back.test_sets.size() != cell.test_sets.size()) std::abort();
  return 0;
}
