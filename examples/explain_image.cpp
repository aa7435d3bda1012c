// Explain one test image of a trained checkpoint: which pixels speak for the class the
// model predicts, by the soft pullback (the semantic pullback of docs/methods.md §1.3)
// and, beside it, the plain gradient. Writes a picture: the image, both heat-maps
// (red: evidence for the class, blue: against it, white: none) and the soft pullback laid
// over the image.
//
// Usage: explain_image [CHECKPOINT [INDEX [OUT.png]]]
//   defaults: runs/quickstart/checkpoint.safetensors (made by tools/quickstart.sh demo),
//   test image 0, explanation.png
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "analysis/common/heatmap.h"
#include "analysis/pullbacks/explain.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "models/model_source.h"
#include "ops/layout.h"

using namespace adjoint;

int main(int argc, char** argv) try {
  const std::string checkpoint = argc > 1 ? argv[1] : "runs/quickstart/checkpoint.safetensors";
  const int64_t index = argc > 2 ? std::stoll(argv[2]) : 0;
  const std::string out = argc > 3 ? argv[3] : "explanation.png";

  // The model, in eval mode, with the normalisation and data set it was trained on.
  const LoadedModel loaded = load_checkpoint_model(checkpoint);
  const Model& model = *loaded.model;

  // One test image of that data set, as raw pixels in [0, 1] (TestOnly: the training
  // files are not read).
  check(!loaded.data_spec.empty(), "checkpoint ", checkpoint, " names no data set");
  const DataSource data = open_data(loaded.data_spec, DataSplits::TestOnly);
  check(index >= 0 && index < data.test->size(), "test image ", index, " is out of range: ", data.spec, " has ",
        data.test->size());
  const Shape image = data.test->shape();  // (C, H, W)
  Tensor raw = Tensor::empty({1, image[0], image[1], image[2]});
  const int64_t label = data.test->get(index, raw.data());

  // The model sees (raw − mean) / std per channel (one value may serve every channel);
  // the explanations are of that input.
  Tensor x = raw.clone();
  if (!loaded.mean.empty()) {
    const int64_t plane = image[1] * image[2];
    for (int64_t ch = 0; ch < image[0]; ++ch) {
      const size_t k = loaded.mean.size() == 1 ? 0 : size_t(ch);
      float* pixels = x.data() + ch * plane;
      for (int64_t i = 0; i < plane; ++i) pixels[i] = (pixels[i] - loaded.mean[k]) / loaded.std[k];
    }
  }

  // Explain the predicted class. Each method is one backward pass from the logits: the
  // cotangent e_c, transported by the soft pullback or the exact gradient.
  const std::vector<int64_t> predicted = predicted_classes(model, x);
  const Tensor soft = explain("soft_pullback", model, x, predicted);
  const Tensor gradient = explain("gradient", model, x, predicted);

  // What the maps say in numbers: the share of the soft pullback's evidence that is
  // positive, and how much the two maps agree (cosine of the channel sums).
  // The maps of the one example (C, H, W): the batch axis goes.
  const Tensor input = squeeze(raw, 0), soft_map = squeeze(soft, 0), gradient_map = squeeze(gradient, 0);
  const std::vector<float> s = channel_sum(soft_map), g = channel_sum(gradient_map);
  double positive = 0, total = 0, sg = 0, ss = 0, gg = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    positive += std::max(0.0f, s[i]), total += std::abs(s[i]);
    sg += double(s[i]) * g[i], ss += double(s[i]) * s[i], gg += double(g[i]) * g[i];
  }
  std::printf("%s, test image %lld of %s: label %lld, predicted %lld\n", checkpoint.c_str(), (long long)index,
              data.spec.c_str(), (long long)label, (long long)predicted[0]);
  std::printf("soft pullback: sum |map| %.4g, positive share %.2f; cosine with the gradient %.3f\n", total,
              total > 0 ? positive / total : 0.0, ss > 0 && gg > 0 ? sg / std::sqrt(ss * gg) : 0.0);

  // The picture: one column per panel, each enlarged so that a 28×28 image is 224 wide.
  const Normalisation none;  // `raw` is already in pixel units
  const int64_t scale = default_scale(image[1], image[2]);
  const Image sheet = contact_sheet({
      {"input", {{render_input(input, none, scale), "label " + std::to_string(label)}}},
      {"soft pullback", {{render_heatmap(soft_map, scale), "class " + std::to_string(predicted[0])}}},
      {"gradient", {{render_heatmap(gradient_map, scale), ""}}},
      {"overlay", {{render_overlay(input, soft_map, none, scale), ""}}},
  });
  write_png(out, sheet);
  std::printf("wrote %s (%lldx%lld)\n", out.c_str(), (long long)sheet.width, (long long)sheet.height);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "explain_image: %s\n", e.what());
  return 1;
}
