// Image decoding (PNG checks, then stb_image), to 3 channels resized to 8×8.
#include <vector>

#include "engine/data/image_folder.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<float> out(3 * 8 * 8);
  try {
    adjoint::decode_image(data, size, "input", 3, 8, 8, out.data());
  } catch (const adjoint::Error&) {
  }
  return 0;
}
