// Stitch two trained checkpoints through the C++ API (docs/methods.md §2): run model A up
// to its block i, map its features with a learned affine stitch S onto model B's features
// after the same block, and let B finish: F(x) = B_{>i}(S(A_{≤i}(x))). Only S trains; A
// and B stay frozen. If B accepts A's features through a mere affine map, the stitched
// model classifies about as well as B itself (a relative score near 1).
//
// Usage: stitch_checkpoints [FRONT.ckpt [END.ckpt [BLOCK [OUT.safetensors]]]]
//   defaults: runs/C1/checkpoint.safetensors, runs/S1/checkpoint.safetensors (the README's
//   stitch example makes both), block 3, and the stitch is not written.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "analysis/common/robustness.h"
#include "analysis/stitching/pair.h"
#include "analysis/stitching/stitched_model.h"
#include "analysis/stitching/train.h"
#include "engine/autograd.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "models/model_source.h"

using namespace adjoint;

// The first `count` examples of a data set as raw pixels in [0, 1], with their labels.
// Stitching feeds raw images: each endpoint applies its own normalisation.
Tensor raw_images(const Dataset& set, int64_t count, std::vector<int64_t>& labels) {
  count = std::min(count, set.size());
  Shape shape = set.shape();
  shape.insert(shape.begin(), count);
  Tensor images = Tensor::empty(shape);
  const int64_t per = images.numel() / count;
  labels.resize(size_t(count));
  for (int64_t n = 0; n < count; ++n) labels[size_t(n)] = set.get(n, images.data() + n * per);
  return images;
}

// A frozen model from its checkpoint, with the normalisation its inputs need.
Endpoint endpoint(const std::string& path, std::string& data_spec) {
  const LoadedModel m = load_checkpoint_model(path);  // in eval mode
  m.model->freeze();  // nothing may move A's or B's parameters
  data_spec = m.data_spec;
  return {path, m.model, m.mean, m.std};
}

int main(int argc, char** argv) try {
  const std::string front_path = argc > 1 ? argv[1] : "runs/C1/checkpoint.safetensors";
  const std::string end_path = argc > 2 ? argv[2] : "runs/S1/checkpoint.safetensors";
  const size_t block = argc > 3 ? std::stoul(argv[3]) : 3;
  const std::string out = argc > 4 ? argv[4] : "";

  std::string front_data, end_data;
  const Endpoint front = endpoint(front_path, front_data), end = endpoint(end_path, end_data);

  // Images of the end model's data set: 512 training images fit the stitch, the first
  // 1000 test images score it.
  const DataSource data = open_data(end_data);
  std::vector<int64_t> train_labels, test_labels;
  const Tensor train_images = raw_images(*data.train, 512, train_labels);
  const Tensor test_images = raw_images(*data.test, 1000, test_labels);

  // The pair: A cut after `block`, B entered after `block`. It probes the feature shapes
  // and refuses a pair no affine map joins.
  const StitchPair pair(front, block, end, block, data.test->shape());
  std::printf("stitching %s after block %zu '%s' into %s after block %zu '%s'\n", front_path.c_str(), block,
              front.model->blocks()[block].name.c_str(), end_path.c_str(), block,
              end.model->blocks()[block].name.c_str());

  // Initialise S by least squares: the affine map that best predicts B's features from A's
  // on the training images.
  auto stitch = std::make_shared<Stitch>(pair.shapes());
  {
    NoGrad no_grad;
    stitch->init_least_squares(pair.front_features(train_images), pair.end_targets(train_images)[0], 1e-4);
  }
  auto stitched = [&](const Tensor& raw) { return pair.stitched_logits(*stitch, raw); };
  const double least_squares = accuracy(stitched, test_images, test_labels);

  // Then train S for two epochs to match B's soft labels (the "slm" objective).
  StitchTrainOptions options;
  options.objective = "slm";
  options.epochs = 2;
  options.batch = 64;
  const StitchTrainResult trained = train_stitch(*stitch, pair, {train_images, train_images, train_labels}, options);

  // Scores: both models alone, then the stitched model; the relative score is the
  // stitched model's accuracy over B's.
  const double a = accuracy([&](const Tensor& raw) { return front.model->forward(front.input(raw)); }, test_images,
                            test_labels);
  const double b = accuracy([&](const Tensor& raw) { return end.model->forward(end.input(raw)); }, test_images,
                            test_labels);
  const double s = accuracy(stitched, test_images, test_labels);
  std::printf("accuracy on %lld test images: A %.2f%%, B %.2f%%\n", (long long)test_labels.size(), 100 * a, 100 * b);
  std::printf("stitched: %.2f%% after least squares, %.2f%% after %lld steps of slm (loss %.4f)\n",
              100 * least_squares, 100 * s, (long long)trained.steps, trained.final_loss);
  std::printf("relative score (stitched / B): %.3f\n", b > 0 ? s / b : 0.0);

  // A stitch file runs like a model: `adjoint predict --stitch OUT` or `adjoint explain --stitch OUT`.
  if (!out.empty()) {
    write_stitch_file(out, pair, *stitch);
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "stitch_checkpoints: %s\n", e.what());
  return 1;
}
