// Does a model recognise the tiles of focus's 2×2 mosaics (docs/methods.md §1.4), and how
// much of each method's positive mass lands on the explained class's tiles? Recognition is
// read two ways: on the mosaic (its top class is the target class, the premise the reproduce
// gates focus on) and on each tile alone (the mosaic with the other three quadrants black:
// its top class is the tile's own class). Once with the mosaics focus scores (four images
// downscaled into one image of the model's size), once with full-size tiles (a 2H × 2W
// mosaic, which a network with global pooling accepts).
//
//   build/analysis/experiments/focus_mosaics CHECKPOINT [MOSAICS]
//
// The mosaics are those of `adjoint explain --metrics focus` (make_mosaics, seed 0) drawn
// from the first 2·MOSAICS test images (default 200 mosaics). Results:
// analysis/results/reproduce/README.md, "Why focus does not separate the methods here", and
// analysis/results/reproduce/focus_recognition.md.
#include <cmath>
#include <cstdio>
#include <string>

#include "analysis/pullbacks/explain.h"
#include "analysis/pullbacks/focus.h"
#include "engine/data/mosaic.h"
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

// Each tile of each mosaic alone, the other quadrants black (`black`: the normalised value of
// a zero pixel per channel): (4M, C, H, W), mosaic m's quadrant q at row 4m + q.
Tensor lone_tiles(const Mosaics& mosaics, const std::vector<float>& black) {
  const int64_t count = mosaics.images.size(0), channels = mosaics.images.size(1), h = mosaics.images.size(2),
                w = mosaics.images.size(3), plane = h * w;
  Tensor out = Tensor::empty({4 * count, channels, h, w});
  for (int64_t m = 0; m < count; ++m)
    for (int64_t q = 0; q < 4; ++q)
      for (int64_t c = 0; c < channels; ++c) {
        const MosaicQuadrant r = mosaic_quadrant(int(q), h, w);
        const float* from = mosaics.images.data() + (m * channels + c) * plane;
        float* to = out.data() + ((4 * m + q) * channels + c) * plane;
        for (int64_t y = 0; y < h; ++y)
          for (int64_t x = 0; x < w; ++x) {
            const bool inside = y >= r.top && y < r.bottom && x >= r.left && x < r.right;
            to[y * w + x] = inside ? from[y * w + x] : black[size_t(c)];
          }
      }
  return out;
}

void report(const char* what, const Model& model, const Mosaics& mosaics) {
  const std::vector<int64_t> top = predicted_classes(model, mosaics.images);
  int64_t named = 0;
  for (size_t i = 0; i < top.size(); ++i) named += top[i] == mosaics.targets[i];
  std::printf("%s: the model's top class is the target class on %.1f%% of %zu mosaics\n", what,
              100.0 * double(named) / double(top.size()), top.size());
  for (const char* method : {"gradient", "input_x_gradient", "soft_pullback", "pullback_ascent", "guided_gradcam"}) {
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
  std::vector<float> black(size_t(shape[0]), 0.0f);
  for (size_t c = 0; c < black.size(); ++c)
    if (!loaded.mean.empty()) black[c] = -loaded.mean[loaded.mean.size() > 1 ? c : 0] / loaded.std[loaded.std.size() > 1 ? c : 0];
  const std::vector<int64_t> alone = predicted_classes(model, lone_tiles(downscaled, black));
  int64_t target_tiles = 0, target_named = 0, other_named = 0;
  for (size_t m = 0; m < downscaled.targets.size(); ++m)
    for (size_t q = 0; q < 4; ++q) {
      const bool named = alone[4 * m + q] == labels[size_t(downscaled.sources[m][q])];
      if (downscaled.target_tiles[m][q]) target_tiles += 1, target_named += named;
      else other_named += named;
    }
  std::printf("  each downscaled tile alone (the rest black): the model names a target tile's class on %.1f%% of %lld, "
              "another tile's on %.1f%% of %lld\n",
              100.0 * double(target_named) / double(target_tiles), (long long)target_tiles,
              100.0 * double(other_named) / double(4 * count - target_tiles), (long long)(4 * count - target_tiles));
  Mosaics full = downscaled;
  full.images = full_size_tiles(downscaled, pool);
  report("full-size tiles (2H x 2W mosaics)", model, full);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "focus_mosaics: %s\n", e.what());
  return 1;
}
