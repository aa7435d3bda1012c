// Image decoding (PNG checks, then stb_image), to 3 channels resized to 8×8, and through
// an evaluation preset's PIL-exact resize and centre crop (engine/data/imagenet.h).
#include <vector>

#include "engine/data/image_folder.h"
#include "engine/data/imagenet.h"
#include "engine/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<float> out(3 * 8 * 8);
  try {
    adjoint::decode_image(data, size, "input", 3, 8, 8, out.data());
  } catch (const adjoint::Error&) {
  }
  try {
    adjoint::EvalPreset preset = adjoint::eval_preset("pvt_v2");  // bicubic
    preset.resize = 10, preset.crop = 8;
    const adjoint::DecodedImage image = adjoint::decode_image_bytes(data, size, "input", 3);
    adjoint::preprocess_image(image.pixels.data(), image.height, image.width, preset, out.data(), "input");
  } catch (const adjoint::Error&) {
  }
  return 0;
}
