#include "analysis/stitching/iri.h"

#include <algorithm>
#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

constexpr float kDefaultAdamRate = 0.01f;  // Adam's rate in [0, 1] pixel units

// ‖f − target‖ / ‖target‖ per example, recorded in f.
Tensor relative_distance(const Tensor& f, const Tensor& target) {
  std::vector<int64_t> axes;
  for (int64_t a = 1; a < f.dim(); ++a) axes.push_back(a);
  const Tensor diff = f - target;
  // The clamp keeps sqrt's gradient finite where x′ reproduces x exactly.
  const Tensor distance = sqrt(clamp(sum(diff * diff, axes), 1e-30f, 3.0e38f));
  const Tensor scale = sqrt(clamp(sum(target * target, axes), 1e-30f, 3.0e38f));
  return distance / scale;
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double position = q * double(values.size() - 1);
  const size_t lo = size_t(position), hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (position - double(lo)) * (values[hi] - values[lo]);
}

}  // namespace

float default_iri_step(const Shape& example) { return float(0.5 * std::sqrt(double(numel(example)) / 3072.0)); }

std::string IriQuality::summary() const {
  char text[160];
  std::snprintf(text, sizeof text, "relative distance median %.4f, 90th percentile %.4f, %.1f%% below %.2f (%lld IRIs)",
                median, p90, 100 * share_below, threshold, (long long)count);
  return text;
}

IriQuality iri_quality(const std::vector<double>& distances, double threshold) {
  check(!distances.empty(), "IRIs: the set is empty");
  IriQuality q;
  q.count = int64_t(distances.size());
  q.threshold = threshold;
  q.median = quantile(distances, 0.5);
  q.p90 = quantile(distances, 0.9);
  q.share_below = double(std::count_if(distances.begin(), distances.end(), [&](double d) { return d < threshold; })) /
                  double(distances.size());
  return q;
}

std::vector<int64_t> derangement(int64_t n, Generator& gen) {
  check(n >= 2, "derangement: needs at least 2 elements, got ", n);
  const std::vector<int64_t> cycle = permutation(n, gen);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) out[size_t(cycle[size_t(k)])] = cycle[size_t((k + 1) % n)];
  return out;
}

IriSet find_iris(const Endpoint& front, size_t block, const Tensor& x, const IriOptions& o,
                 const std::function<void(int64_t, int64_t)>& progress) {
  check(x.defined() && x.dim() == 4, "IRIs: expects raw images (N, C, H, W), got ", x.defined() ? x.shape() : Shape{});
  const int64_t N = x.size(0);
  check(N > 0, "IRIs: the set of images for ", front.name, " block ", block, " is empty");
  check(o.batch > 0, "IRIs: the batch must be positive, got ", o.batch);
  const Tensor images = x.contiguous();
  Generator gen(o.seed);
  IriSet set;
  if (o.start == "derangement") {
    check(N >= 2, "IRIs: a derangement start needs at least 2 images, got ", N, " (use the noise start)");
    const std::vector<int64_t> from = derangement(N, gen);
    set.starts = Tensor::empty(images.shape());
    const int64_t per = images.numel() / N;
    set.start_index = from;
    for (int64_t n = 0; n < N; ++n)
      std::copy(images.data() + from[size_t(n)] * per, images.data() + (from[size_t(n)] + 1) * per,
                set.starts.data() + n * per);
  } else if (o.start == "noise") {
    set.starts = uniform(images.shape(), o.search.range.lo, o.search.range.hi, gen);
    set.start_index.assign(size_t(N), -1);
  } else {
    throw UsageError(cat("IRIs: unknown start '", o.start, "'; starts: derangement, noise"));
  }
  InputSearchOptions search = o.search;
  if (search.step <= 0)
    search.step = search.rule == "adam" ? kDefaultAdamRate
                                        : default_iri_step(Shape(images.shape().begin() + 1, images.shape().end()));
  // A paired with itself: checks the block and the eval mode once, and cuts A after the block.
  const StitchPair cut(front, block, front, block, Shape(images.shape().begin() + 1, images.shape().end()));
  set.inputs = Tensor::empty(images.shape());
  const int64_t per = images.numel() / N;
  for (int64_t begin = 0; begin < N; begin += o.batch) {
    const int64_t end = std::min(N, begin + o.batch);
    Tensor target;
    {
      NoGrad off;
      target = cut.front_features(select_rows(images, begin, end)).contiguous();
    }
    const InputSearchResult r = minimise_per_example(
        [&](const Tensor& candidate) { return relative_distance(cut.front_features(candidate), target); },
        select_rows(set.starts, begin, end), search);
    std::copy(r.best.data(), r.best.data() + r.best.numel(), set.inputs.data() + begin * per);
    set.distance.insert(set.distance.end(), r.best_loss.begin(), r.best_loss.end());
    if (progress) progress(end, N);
  }
  set.quality = iri_quality(set.distance);
  return set;
}

}  // namespace adjoint
