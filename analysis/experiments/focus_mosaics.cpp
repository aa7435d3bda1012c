// Why focus (docs/methods.md §1.4) does not rank the explanation methods on Fashion-MNIST:
// does the model itself recognise the tiles of a 2×2 mosaic, and how much of each method's
// positive mass lands on the explained class's tiles? Once with the mosaics focus scores
// (four images downscaled into one image of the model's size), once with full-size tiles (a
// 2H × 2W mosaic, which a network with global pooling accepts).
//
//   build/analysis/experiments/focus_mosaics CHECKPOINT [MOSAICS]
//
// The mosaics are those of `adjoint explain --metrics focus` (make_mosaics, seed 0) drawn
// from the first 2·MOSAICS test images (default 200 mosaics). Results:
// analysis/results/reproduce/README.md, "Why focus does not separate the methods here".
#include <cmath>
#include <cstdio>
#include <string>

#include "analysis/pullbacks/explain.h"
#include "analysis/pullbacks/focus.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "models/model_source.h"

using namespace adjoint;

namespace {

// The same mosaics with each tile its own full-size image: (M, C, 2H, 2W).
Tensor full_size_tiles(const Mosaics& mosaics, const Tensor& pool) {
  const int64_t count = mosaics.images.size(0), channels = pool.size(1), h = pool.size(2), w = pool.size(3);
  Tensor out = Tensor::zeros({count, channels, 2 * h, 2 * w});
  for (int64_t m = 0; m < count; ++m)
    for (int q = 0; q < 4; ++q) {  // quadrants in reading order, as make_mosaics places them
      const int64_t source = mosaics.sources[size_t(m)][size_t(q)], top = q >= 2 ? h : 0, left = q % 2 ? w : 0;
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t y = 0; y < h; ++y)
          for (int64_t x = 0; x < w; ++x)
            out.data()[((m * channels + c) * 2 * h + top + y) * 2 * w + left + x] =
                pool.data()[((source * channels + c) * h + y) * w + x];
    }
  return out;
}

void report(const char* what, const Model& model, const Mosaics& mosaics) {
  const std::vector<int64_t> top = predicted_classes(model, mosaics.images);
  int64_t named = 0;
  for (size_t i = 0; i < top.size(); ++i) named += top[i] == mosaics.targets[i];
  std::printf("%s: the model's top class is the target class on %.1f%% of %zu mosaics\n", what,
              100.0 * double(named) / double(top.size()), top.size());
  for (const char* method : {"gradient", "soft_pullback", "pullback"}) {
    const MetricResult f = focus(mosaics, explain(method, model, mosaics.images, mosaics.targets));
    double sum = 0;
    int64_t n = 0;
    for (double v : f.values)
      if (std::isfinite(v)) sum += v, ++n;
    std::printf("  focus of %-14s %.3f\n", method, n ? sum / double(n) : NAN);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  check(argc >= 2, "usage: focus_mosaics CHECKPOINT [MOSAICS]");
  const int64_t count = argc > 2 ? std::stoll(argv[2]) : 200;
  const LoadedModel loaded = load_checkpoint_model(argv[1]);
  const Model& model = *loaded.model;
  const DataSource data = open_data(loaded.data_spec, DataSplits::TestOnly);
  const Shape shape = data.test->shape();
  const int64_t pool_size = std::min<int64_t>(2 * count, data.test->size()), d = shape[0] * shape[1] * shape[2];

  // The pool as the model sees it: normalised test images, and their labels.
  Tensor pool = Tensor::empty({pool_size, shape[0], shape[1], shape[2]});
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < pool_size; ++i) labels.push_back(data.test->get(i, pool.data() + i * d));
  for (int64_t i = 0; i < pool.numel(); ++i) {
    const size_t channel = loaded.mean.size() > 1 ? size_t((i / (shape[1] * shape[2])) % shape[0]) : 0;
    if (!loaded.mean.empty()) pool.data()[i] = (pool.data()[i] - loaded.mean[channel]) / loaded.std[channel];
  }
  const std::vector<int64_t> plain = predicted_classes(model, pool);
  int64_t correct = 0;
  for (int64_t i = 0; i < pool_size; ++i) correct += plain[size_t(i)] == labels[size_t(i)];
  std::printf("%s: %.1f%% accuracy on the %lld plain test images\n", argv[1], 100.0 * double(correct) / double(pool_size),
              (long long)pool_size);

  const Mosaics downscaled = make_mosaics(pool, labels, count, 0);
  report("downscaled tiles (the focus metric's mosaics)", model, downscaled);
  Mosaics full = downscaled;
  full.images = full_size_tiles(downscaled, pool);
  report("full-size tiles (2H x 2W mosaics)", model, full);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "focus_mosaics: %s\n", e.what());
  return 1;
}
