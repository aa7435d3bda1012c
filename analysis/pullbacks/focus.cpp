#include "analysis/pullbacks/focus.h"

#include <algorithm>
#include <limits>
#include <map>

#include "engine/data/mosaic.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

// One uniformly drawn element of a non-empty list.
int64_t pick(const std::vector<int64_t>& items, Generator& gen) {
  return items[static_cast<size_t>(randint(static_cast<int64_t>(items.size()), gen))];
}

}  // namespace

Mosaics make_mosaics(const Tensor& pool, const std::vector<int64_t>& labels, int64_t count, uint64_t seed) {
  check(pool.defined() && pool.dim() == 4, "make_mosaics: the pool must be images (P, C, H, W), got ",
        pool.defined() ? to_string(pool.shape()) : std::string("undefined"));
  check(static_cast<int64_t>(labels.size()) == pool.size(0), "make_mosaics: ", labels.size(), " labels for a pool of ",
        pool.size(0), " images");
  check(count >= 0, "make_mosaics: negative count ", count);
  const int64_t channels = pool.size(1), height = pool.size(2), width = pool.size(3);
  check(height >= 2 && width >= 2, "make_mosaics: images ", pool.shape(), " are too small to tile 2x2");

  std::map<int64_t, std::vector<int64_t>> by_class;
  for (size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<int64_t>(i));
  std::vector<int64_t> eligible;  // classes that can fill both target tiles, with another class to fill the rest
  for (const auto& [label, members] : by_class)
    if (members.size() >= 2 && by_class.size() >= 2) eligible.push_back(label);
  check(!eligible.empty(), "make_mosaics: the pool needs a class with at least two images and images of another class");

  Mosaics out;
  out.targets.resize(static_cast<size_t>(count));
  out.target_tiles.resize(static_cast<size_t>(count));
  out.sources.resize(static_cast<size_t>(count));
  for (int64_t m = 0; m < count; ++m) {
    Generator gen = keyed_generator(seed, RandomStream::focus, {static_cast<uint64_t>(m)});
    const int64_t target = pick(eligible, gen);
    const std::vector<int64_t>& members = by_class[target];
    // Two distinct images of the target class.
    const int64_t first = randint(static_cast<int64_t>(members.size()), gen);
    int64_t second = randint(static_cast<int64_t>(members.size()) - 1, gen);
    if (second >= first) ++second;
    // Two images of other classes, of two different classes when there are.
    std::vector<int64_t> others;
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] != target) others.push_back(static_cast<int64_t>(i));
    const int64_t other1 = pick(others, gen);
    std::vector<int64_t> rest;
    for (int64_t i : others)
      if (labels[static_cast<size_t>(i)] != labels[static_cast<size_t>(other1)]) rest.push_back(i);
    if (rest.empty())
      for (int64_t i : others)
        if (i != other1) rest.push_back(i);
    const int64_t other2 = rest.empty() ? other1 : pick(rest, gen);

    const std::vector<int64_t> order = permutation(4, gen);  // quadrants of: target, target, other, other
    const int64_t shown[4] = {members[static_cast<size_t>(first)], members[static_cast<size_t>(second)], other1, other2};
    out.targets[static_cast<size_t>(m)] = target;
    for (int k = 0; k < 4; ++k) {
      out.sources[static_cast<size_t>(m)][static_cast<size_t>(order[k])] = shown[k];
      out.target_tiles[static_cast<size_t>(m)][static_cast<size_t>(order[k])] = k < 2;
    }
  }

  const Tensor images = pool.detach().contiguous();
  const float* src = images.data();
  const int64_t d = channels * height * width;
  out.images = Tensor::empty({count, channels, height, width});
  float* dst = out.images.data();
  parallel_for(count, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      std::array<const float*, 4> tiles;
      for (size_t q = 0; q < 4; ++q) tiles[q] = src + out.sources[static_cast<size_t>(m)][q] * d;
      compose_mosaic(tiles, channels, height, width, dst + m * d);
    }
  });
  return out;
}

MetricResult focus(const Mosaics& mosaics, const Tensor& attr) {
  check(attr.defined() && mosaics.images.defined() && attr.shape() == mosaics.images.shape(),
        "focus: attribution ", attr.defined() ? to_string(attr.shape()) : std::string("undefined"),
        " does not have the mosaics' shape ",
        mosaics.images.defined() ? to_string(mosaics.images.shape()) : std::string("undefined"));
  const Tensor a_map = attr.detach().contiguous();
  const int64_t count = a_map.size(0), channels = a_map.size(1), height = a_map.size(2), width = a_map.size(3);
  const int64_t d = channels * height * width;
  const float* pa = a_map.data();
  std::vector<double> values(static_cast<size_t>(count));
  parallel_for(count, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      double in_target = 0, total = 0;
      for (int q = 0; q < 4; ++q) {
        const MosaicQuadrant r = mosaic_quadrant(q, height, width);
        double mass = 0;
        for (int64_t c = 0; c < channels; ++c)
          for (int64_t y = r.top; y < r.bottom; ++y)
            for (int64_t x = r.left; x < r.right; ++x)
              mass += std::max(0.0f, pa[m * d + (c * height + y) * width + x]);
        total += mass;
        if (mosaics.target_tiles[static_cast<size_t>(m)][static_cast<size_t>(q)]) in_target += mass;
      }
      values[static_cast<size_t>(m)] = total > 0 ? in_target / total : std::numeric_limits<double>::quiet_NaN();
    }
  });
  return {metric_info("focus"), values};
}

std::vector<double> recognised_mosaics(const Mosaics& mosaics, const std::vector<int64_t>& predicted) {
  check(predicted.size() == mosaics.targets.size(), "recognised_mosaics: ", predicted.size(), " predictions for ",
        mosaics.targets.size(), " mosaics");
  std::vector<double> out(predicted.size());
  for (size_t m = 0; m < predicted.size(); ++m) out[m] = predicted[m] == mosaics.targets[m] ? 1.0 : 0.0;
  return out;
}

}  // namespace adjoint
