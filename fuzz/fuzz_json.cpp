// JSON: parse; whatever parses must print and parse back to the same value.
#include <cstdlib>
#include <string_view>

#include "engine/error.h"
#include "engine/io/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  adjoint::Json value;
  try {
    value = adjoint::parse_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const adjoint::Error&) {
    return 0;
  }
  if (!(adjoint::parse_json(adjoint::to_json(value)) == value)) std::abort();
  if (!(adjoint::parse_json(adjoint::to_json(value, 2)) == value)) std::abort();
  return 0;
}
