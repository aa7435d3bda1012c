// The tiny stitching pair of tests/goldens/gen_stitch.py, rebuilt from the fixture's
// weights: two VGG-11-BN models at width 1/32 on 1×16×16 inputs, each with its own input
// normalisation. Shared by the stitching tests.
#pragma once
#include <map>
#include <string>

#include "analysis/stitching/pair.h"
#include "models/checkpoint.h"
#include "tests/support.h"

namespace adjoint::testing {

inline ModelConfig tiny_vgg_config() {
  ModelConfig c;
  c.arch = "vgg11_bn";
  c.width = 1.0 / 32;
  c.in_channels = 1;
  c.image_size = 16;
  c.num_classes = 10;
  return c;
}

// Model "A" or "B" of the fixture, in eval mode, with its normalisation.
inline Endpoint stitch_fixture_model(const std::string& which) {
  Generator gen(0);
  Endpoint e{which, make_model(tiny_vgg_config(), gen), {}, {}};
  std::map<std::string, Tensor> weights;
  for (const auto& [name, t] : fixture("stitch").tensors)
    if (name.rfind(which + ".", 0) == 0) weights[name.substr(which.size() + 1)] = t;
  load_state_dict(*e.model, weights, "stitch fixture " + which);
  e.model->train(false);
  e.mean = which == "A" ? std::vector<float>{0.3f} : std::vector<float>{0.5f};
  e.std = which == "A" ? std::vector<float>{0.4f} : std::vector<float>{0.25f};
  return e;
}

}  // namespace adjoint::testing
