#include "analysis/pullbacks/metrics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- validation -------------------------------------------------------------------------

std::string shape_text(const Tensor& t) { return t.defined() ? to_string(t.shape()) : std::string("undefined"); }

void check_batch(const std::string& metric, const Tensor& x, const std::vector<int64_t>& targets) {
  check(x.defined() && x.dim() >= 2, metric, ": x must be a batch (N, ...), got ", shape_text(x));
  check(static_cast<int64_t>(targets.size()) == x.size(0), metric, ": ", targets.size(),
        " target classes for a batch of ", x.size(0), " examples ", x.shape());
}

void check_images(const std::string& metric, const Shape& shape) {
  check(shape.size() == 4, metric, ": needs images (N, C, H, W), x is ", shape);
}

void check_map(const std::string& metric, const Shape& input_shape, const Tensor& attr, const char* what = "attribution") {
  check(attr.defined() && attr.shape() == input_shape, metric, ": ", what, " ", shape_text(attr),
        " does not have the input's shape ", input_shape);
}

// A tensor's values in row-major order without copying when it already is.
Tensor dense(const Tensor& t) { return t.detach().contiguous(); }

Shape example_shape(const Shape& batch_shape) { return Shape(batch_shape.begin() + 1, batch_shape.end()); }

// ---- running the model ------------------------------------------------------------------

// The target logit f_c of `count` model inputs, each written by write_input(j, dst) and
// scored for class target_of(j), `batch_size` inputs per classifier call, recording off.
std::vector<double> target_logits(const Classifier& model, const std::string& metric, const Shape& one_example,
                                  int64_t count, int64_t batch_size, const std::function<int64_t(int64_t)>& target_of,
                                  const std::function<void(int64_t, float*)>& write_input) {
  check(batch_size > 0, metric, ": batch_size must be positive, got ", batch_size);
  const int64_t d = numel(one_example);
  std::vector<double> out(static_cast<size_t>(count));
  NoGrad no_grad;
  for (int64_t start = 0; start < count; start += batch_size) {
    const int64_t n = std::min(batch_size, count - start);
    Shape shape{n};
    shape.insert(shape.end(), one_example.begin(), one_example.end());
    Tensor batch = Tensor::empty(shape);
    float* p = batch.data();
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) write_input(start + i, p + i * d);
    });
    const Tensor logits = dense(model(batch));
    check(logits.dim() == 2 && logits.size(0) == n, metric, ": the classifier returned ", logits.shape(),
          " for a batch of ", n, " inputs; expected logits (", n, ", classes)");
    const int64_t classes = logits.size(1);
    const float* l = logits.data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = target_of(start + i);
      check(c >= 0 && c < classes, metric, ": target class ", c, " is outside the classifier's ", classes, " classes");
      out[static_cast<size_t>(start + i)] = l[i * classes + c];
    }
  }
  return out;
}

// f_c(x) of each example.
std::vector<double> clean_logits(const Classifier& model, const std::string& metric, const Tensor& x,
                                 const std::vector<int64_t>& targets, int64_t batch_size) {
  const float* px = x.data();
  const int64_t d = numel(example_shape(x.shape()));
  return target_logits(
      model, metric, example_shape(x.shape()), x.size(0), batch_size, [&](int64_t i) { return targets[i]; },
      [&](int64_t i, float* dst) { std::copy(px + i * d, px + (i + 1) * d, dst); });
}

// ---- patches ------------------------------------------------------------------------------

// Writes `value(c, y, x)` (patch-relative y, x) over the patch of a (C, H, W) image.
template <class Value>
void fill_patch(float* image, int64_t channels, int64_t height, int64_t width, const Patch& patch, Value value) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < patch.height; ++y) {
      float* row = image + (c * height + patch.top + y) * width + patch.left;
      for (int64_t x = 0; x < patch.width; ++x) row[x] = value(c, y, x);
    }
}

// Σ term(c, y, x, flat index) over the patch of a (C, H, W) image.
template <class Term>
double sum_patch(int64_t channels, int64_t height, int64_t width, const Patch& patch, Term term) {
  double s = 0;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < patch.height; ++y) {
      const int64_t row = (c * height + patch.top + y) * width + patch.left;
      for (int64_t x = 0; x < patch.width; ++x) s += term(c, y, x, row + x);
    }
  return s;
}

int64_t default_patch_size(int64_t height) { return std::max<int64_t>(1, (height + 7) / 8); }

// One perturbation of Infidelity: the patch and the noise (C, h, w) written into it.
struct NoisePatch {
  Patch patch;
  Tensor noise;
};

NoisePatch infidelity_perturbation(const InfidelityOptions& options, InputRange range, const Shape& shape,
                                   int64_t example, int64_t k) {
  const int64_t channels = shape[1], height = shape[2], width = shape[3];
  const int64_t size = options.patch_sizes[static_cast<size_t>(k / options.samples_per_size)];
  const int64_t h = std::min(size, height), w = std::min(size, width);
  Generator gen = keyed_generator(options.seed, RandomStream::infidelity,
                                  {static_cast<uint64_t>(options.first_example + example), static_cast<uint64_t>(k)});
  const int64_t top = randint(height - h + 1, gen);
  const int64_t left = randint(width - w + 1, gen);
  const InputRange noise = options.noise.value_or(range);
  return {{top, left, h, w}, uniform({channels, h, w}, noise.lo, noise.hi, gen)};
}

// The features (flat indices of one example of shape `one`) of subset s: a partial
// Fisher–Yates shuffle driven by the example's keyed generator, or with a patch size the
// elements of one square patch (all channels) at a random position.
std::vector<int64_t> feature_subset(const FaithfulnessCorrelationOptions& options, const Shape& one, int64_t example,
                                    int64_t s) {
  Generator gen = keyed_generator(options.seed, RandomStream::faithfulness_correlation,
                                  {static_cast<uint64_t>(options.first_example + example), static_cast<uint64_t>(s)});
  if (options.patch_size > 0) {
    const int64_t channels = one[0], height = one[1], width = one[2];
    const int64_t h = std::min(options.patch_size, height), w = std::min(options.patch_size, width);
    const int64_t top = randint(height - h + 1, gen), left = randint(width - w + 1, gen);
    std::vector<int64_t> index;
    index.reserve(static_cast<size_t>(channels * h * w));
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t y = top; y < top + h; ++y)
        for (int64_t x = left; x < left + w; ++x) index.push_back((c * height + y) * width + x);
    return index;
  }
  const int64_t features = numel(one);
  std::vector<int64_t> index(static_cast<size_t>(features));
  std::iota(index.begin(), index.end(), int64_t{0});
  for (int64_t i = 0; i < options.subset_size; ++i) std::swap(index[i], index[i + randint(features - i, gen)]);
  index.resize(static_cast<size_t>(options.subset_size));
  return index;
}

// Runs body(i) for every example, in parallel.
void for_each_example(int64_t n, const std::function<void(int64_t)>& body) {
  parallel_for(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) body(i);
  });
}

}  // namespace

// ---- catalogue ----------------------------------------------------------------------------

const std::vector<MetricInfo>& metric_catalogue() {
  static const std::vector<MetricInfo> catalogue = {
      {"infidelity", false,
       "mean squared error between the optimally scaled <attr, x - x_pert> and the target-logit drop, over random "
       "noise patches"},
      {"max_sensitivity", false, "largest relative change ||a(x) - a(x + d)|| / ||a(x)|| over small uniform input noise",
       "a map of zeros (the change is relative to its norm)"},
      {"random_logit", false, "Pearson correlation between the maps for the target class and for a random other class",
       "either map constant, as a map of zeros is (a correlation with a constant is undefined, as in scipy.stats.pearsonr)"},
      {"faithfulness_correlation", true,
       "Pearson correlation between the attribution sum of random feature subsets and the logit drop when they are "
       "set to the baseline",
       "equal subset sums, as a map of zeros gives, or equal logit drops (a correlation with a constant is undefined)"},
      {"faithfulness_estimate", true,
       "Pearson correlation between patch attribution sums and the logit drop when each patch is set to the baseline",
       "equal patch sums, as a map of zeros gives, or equal logit drops (a correlation with a constant is undefined)"},
      {"monotonicity_correlation", true,
       "Spearman correlation between patch sums of |attr| and the mean squared logit change when the patch is noised",
       "equal patch sums, as a map of zeros gives, or equal logit changes (a correlation with a constant is undefined)"},
      {"sparseness", true, "Gini index of |attr|", "a map of zeros"},
      {"complexity", false, "entropy of |attr| / sum |attr|", "a map of zeros"},
      {"model_parameter_randomisation", false,
       "Spearman correlation between the maps of the model and of copies with layers re-initialised top-down",
       "a constant map of the model or of a copy (a correlation with a constant is undefined)"},
      {"focus", true, "share of the positive attribution mass in the target-class tiles of 2x2 mosaics",
       "a map with no positive value (no mass to share out), as guided Grad-CAM gives where Grad-CAM's ReLU leaves nothing"},
  };
  return catalogue;
}

const MetricInfo& metric_info(const std::string& name) {
  std::string known;
  for (const MetricInfo& info : metric_catalogue()) {
    if (info.name == name) return info;
    known += (known.empty() ? "" : ", ") + info.name;
  }
  throw Error(cat("metric_info: unknown metric '", name, "'; known: ", known));
}

Generator keyed_generator(uint64_t seed, RandomStream stream, std::initializer_list<uint64_t> path) {
  uint64_t key = seed;
  const auto absorb = [&](uint64_t part) {
    const auto w = philox(key, part);
    key = (uint64_t(w[0]) << 32) | w[1];
  };
  absorb(static_cast<uint64_t>(stream));
  for (uint64_t part : path) absorb(part);
  return Generator(key);
}

std::vector<Patch> patch_grid(int64_t height, int64_t width, int64_t patch_size) {
  check(height > 0 && width > 0 && patch_size > 0, "patch_grid: bad sizes ", height, "x", width, " with patch ",
        patch_size);
  std::vector<Patch> grid;
  for (int64_t top = 0; top < height; top += patch_size)
    for (int64_t left = 0; left < width; left += patch_size)
      grid.push_back({top, left, std::min(patch_size, height - top), std::min(patch_size, width - left)});
  return grid;
}

// ---- Infidelity ---------------------------------------------------------------------------

int64_t InfidelityProbe::samples() const {
  return static_cast<int64_t>(options.patch_sizes.size()) * options.samples_per_size;
}

InfidelityProbe probe_infidelity(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                 InputRange range, InfidelityOptions options) {
  const std::string metric = "infidelity";
  check_batch(metric, x, targets);
  check_images(metric, x.shape());
  check(range.hi > range.lo, metric, ": empty input range [", range.lo, ", ", range.hi, "]");
  check(options.samples_per_size > 0, metric, ": samples_per_size must be positive, got ", options.samples_per_size);
  const int64_t height = x.size(2);
  if (options.patch_sizes.empty())
    options.patch_sizes = {std::max<int64_t>(1, height / 2), std::max<int64_t>(1, height / 4)};
  for (int64_t size : options.patch_sizes) check(size > 0, metric, ": patch size ", size, " must be positive");

  // A copy: the probe must not change when the caller reuses x's storage.
  InfidelityProbe probe{x.detach().clone(), range, options, {}};
  const Tensor& xc = probe.x;
  const int64_t n = xc.size(0), d = numel(example_shape(xc.shape())), samples = probe.samples();
  const int64_t channels = xc.size(1), width = xc.size(3);
  const float* px = xc.data();
  const std::vector<double> clean = clean_logits(model, metric, xc, targets, options.batch_size);
  const std::vector<double> perturbed = target_logits(
      model, metric, example_shape(xc.shape()), n * samples, options.batch_size,
      [&](int64_t j) { return targets[static_cast<size_t>(j / samples)]; },
      [&](int64_t j, float* dst) {
        const int64_t i = j / samples;
        std::copy(px + i * d, px + (i + 1) * d, dst);
        const NoisePatch p = infidelity_perturbation(probe.options, range, xc.shape(), i, j % samples);
        const float* noise = p.noise.data();
        fill_patch(dst, channels, height, width, p.patch, [&](int64_t c, int64_t y, int64_t x) {
          return noise[(c * p.patch.height + y) * p.patch.width + x];
        });
      });
  probe.output_drops.resize(perturbed.size());
  for (size_t j = 0; j < perturbed.size(); ++j)
    probe.output_drops[j] = clean[j / static_cast<size_t>(samples)] - perturbed[j];
  return probe;
}

MetricResult infidelity(const InfidelityProbe& probe, const Tensor& attr) {
  check_map("infidelity", probe.x.shape(), attr);
  const Tensor a_map = dense(attr);
  const Shape& shape = probe.x.shape();
  const int64_t n = shape[0], channels = shape[1], height = shape[2], width = shape[3];
  const int64_t d = channels * height * width, samples = probe.samples();
  const float* px = probe.x.data();
  const float* pa = a_map.data();
  std::vector<double> values(static_cast<size_t>(n));
  for_each_example(n, [&](int64_t i) {
    std::vector<double> a(static_cast<size_t>(samples));
    const double* b = probe.output_drops.data() + i * samples;
    for (int64_t k = 0; k < samples; ++k) {
      const NoisePatch p = infidelity_perturbation(probe.options, probe.range, shape, i, k);
      const float* noise = p.noise.data();
      // ⟨attr, x − x_pert⟩ over the patch, the only place where I is non-zero.
      a[k] = sum_patch(channels, height, width, p.patch, [&](int64_t c, int64_t y, int64_t x, int64_t flat) {
        return double(pa[i * d + flat]) * (double(px[i * d + flat]) - noise[(c * p.patch.height + y) * p.patch.width + x]);
      });
    }
    double ab = 0, aa = 0;
    for (int64_t k = 0; k < samples; ++k) ab += a[k] * b[k], aa += a[k] * a[k];
    const double beta = aa > 0 ? ab / aa : 0.0;
    double error = 0;
    for (int64_t k = 0; k < samples; ++k) error += (beta * a[k] - b[k]) * (beta * a[k] - b[k]);
    values[static_cast<size_t>(i)] = error / static_cast<double>(samples);
  });
  return {metric_info("infidelity"), values};
}

MetricResult infidelity(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                        const Tensor& attr, InputRange range, const InfidelityOptions& options) {
  check_map("infidelity", x.shape(), attr);
  return infidelity(probe_infidelity(model, x, targets, range, options), attr);
}

// ---- Max-Sensitivity ----------------------------------------------------------------------

MetricResult max_sensitivity(const Explainer& explainer, const Tensor& x, const std::vector<int64_t>& targets,
                             InputRange range, const MaxSensitivityOptions& options, const Tensor& attr) {
  const std::string metric = "max_sensitivity";
  check_batch(metric, x, targets);
  check(options.samples > 0, metric, ": samples must be positive, got ", options.samples);
  check(options.radius >= 0, metric, ": radius must not be negative, got ", options.radius);
  const Tensor xc = dense(x);
  const Tensor a0 = dense(attr.defined() ? attr : explainer(xc, targets));
  check_map(metric, xc.shape(), a0);
  const int64_t n = xc.size(0), d = numel(example_shape(xc.shape()));
  const float r = static_cast<float>(options.radius * range.width());
  const float* px = xc.data();
  const float* p0 = a0.data();

  std::vector<double> norm0(static_cast<size_t>(n)), worst(static_cast<size_t>(n), 0.0);
  for_each_example(n, [&](int64_t i) {
    double s = 0;
    for (int64_t k = 0; k < d; ++k) s += double(p0[i * d + k]) * p0[i * d + k];
    norm0[static_cast<size_t>(i)] = std::sqrt(s);
  });
  for (int64_t sample = 0; sample < options.samples; ++sample) {
    Tensor moved = Tensor::empty(xc.shape());
    float* pm = moved.data();
    for_each_example(n, [&](int64_t i) {
      Generator gen = keyed_generator(options.seed, RandomStream::max_sensitivity,
                                      {static_cast<uint64_t>(options.first_example + i), static_cast<uint64_t>(sample)});
      const Tensor delta = uniform({d}, -r, r, gen);
      const float* pd = delta.data();
      for (int64_t k = 0; k < d; ++k) pm[i * d + k] = px[i * d + k] + pd[k];
    });
    const Tensor a1 = dense(explainer(moved, targets));
    check_map(metric, xc.shape(), a1, "explanation of the perturbed input");
    const float* p1 = a1.data();
    for_each_example(n, [&](int64_t i) {
      double s = 0;
      for (int64_t k = 0; k < d; ++k) {
        const double diff = double(p0[i * d + k]) - p1[i * d + k];
        s += diff * diff;
      }
      worst[static_cast<size_t>(i)] = std::max(worst[static_cast<size_t>(i)], std::sqrt(s));
    });
  }
  std::vector<double> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i) values[i] = norm0[i] > 0 ? worst[i] / norm0[i] : kNaN;
  return {metric_info(metric), values};
}

// ---- Random Logit -------------------------------------------------------------------------

int64_t random_other_class(int64_t target, int64_t num_classes, uint64_t seed, int64_t example) {
  check(num_classes >= 2, "random_logit: needs at least 2 classes, got ", num_classes);
  check(target >= 0 && target < num_classes, "random_logit: target class ", target, " is outside the ", num_classes,
        " classes");
  Generator gen = keyed_generator(seed, RandomStream::random_logit, {static_cast<uint64_t>(example)});
  // A uniform draw among the num_classes − 1 others: skip over the target.
  const int64_t other = randint(num_classes - 1, gen);
  return other >= target ? other + 1 : other;
}

MetricResult random_logit(const Explainer& explainer, const Tensor& x, const std::vector<int64_t>& targets,
                          int64_t num_classes, const RandomLogitOptions& options, const Tensor& attr) {
  const std::string metric = "random_logit";
  check_batch(metric, x, targets);
  const Tensor xc = dense(x);
  const int64_t n = xc.size(0), d = numel(example_shape(xc.shape()));
  std::vector<int64_t> others(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    others[static_cast<size_t>(i)] =
        random_other_class(targets[static_cast<size_t>(i)], num_classes, options.seed, options.first_example + i);
  const Tensor a_target = dense(attr.defined() ? attr : explainer(xc, targets));
  check_map(metric, xc.shape(), a_target);
  const Tensor a_other = dense(explainer(xc, others));
  check_map(metric, xc.shape(), a_other, "explanation for the other class");
  std::vector<double> values(static_cast<size_t>(n));
  for_each_example(n, [&](int64_t i) {
    const std::vector<double> u(a_target.data() + i * d, a_target.data() + (i + 1) * d);
    const std::vector<double> v(a_other.data() + i * d, a_other.data() + (i + 1) * d);
    values[static_cast<size_t>(i)] = pearson(u, v);
  });
  return {metric_info(metric), values};
}

// ---- Faithfulness Correlation -------------------------------------------------------------

FaithfulnessCorrelationProbe probe_faithfulness_correlation(const Classifier& model, const Tensor& x,
                                                            const std::vector<int64_t>& targets,
                                                            FaithfulnessCorrelationOptions options) {
  const std::string metric = "faithfulness_correlation";
  check_batch(metric, x, targets);
  const Tensor xc = dense(x);
  const int64_t n = xc.size(0), d = numel(example_shape(xc.shape()));
  check(options.subsets >= 2, metric, ": needs at least 2 subsets for a correlation, got ", options.subsets);
  if (options.patch_size > 0) {
    check_images(metric, xc.shape());
    options.subset_size = xc.size(1) * std::min(options.patch_size, xc.size(2)) * std::min(options.patch_size, xc.size(3));
  } else if (options.subset_size == 0) {
    check(options.subset_fraction > 0 && options.subset_fraction <= 1, metric, ": subset_fraction ",
          options.subset_fraction, " is outside (0, 1]");
    options.subset_size = std::clamp<int64_t>(std::llround(options.subset_fraction * static_cast<double>(d)), 1, d);
  }
  check(options.subset_size > 0 && options.subset_size <= d, metric, ": subset_size ", options.subset_size,
        " is outside [1, ", d, "] (features per example)");

  const int64_t subsets = options.subsets;
  const float* px = xc.data();
  const std::vector<double> clean = clean_logits(model, metric, xc, targets, options.batch_size);
  const std::vector<double> perturbed = target_logits(
      model, metric, example_shape(xc.shape()), n * subsets, options.batch_size,
      [&](int64_t j) { return targets[static_cast<size_t>(j / subsets)]; },
      [&](int64_t j, float* dst) {
        const int64_t i = j / subsets;
        std::copy(px + i * d, px + (i + 1) * d, dst);
        for (int64_t f : feature_subset(options, example_shape(xc.shape()), i, j % subsets)) dst[f] = options.baseline;
      });
  FaithfulnessCorrelationProbe probe{xc.shape(), options, std::vector<double>(perturbed.size())};
  for (size_t j = 0; j < perturbed.size(); ++j)
    probe.output_drops[j] = clean[j / static_cast<size_t>(subsets)] - perturbed[j];
  return probe;
}

MetricResult faithfulness_correlation(const FaithfulnessCorrelationProbe& probe, const Tensor& attr) {
  const std::string metric = "faithfulness_correlation";
  check_map(metric, probe.shape, attr);
  const Tensor a_map = dense(attr);
  const int64_t n = probe.shape[0], d = numel(example_shape(probe.shape)), subsets = probe.options.subsets;
  const float* pa = a_map.data();
  std::vector<double> values(static_cast<size_t>(n));
  for_each_example(n, [&](int64_t i) {
    std::vector<double> sums(static_cast<size_t>(subsets));
    for (int64_t s = 0; s < subsets; ++s)
      for (int64_t f : feature_subset(probe.options, example_shape(probe.shape), i, s))
        sums[static_cast<size_t>(s)] += pa[i * d + f];
    const double* drops = probe.output_drops.data() + i * subsets;
    values[static_cast<size_t>(i)] = pearson(sums, std::span<const double>(drops, static_cast<size_t>(subsets)));
  });
  return {metric_info(metric), values};
}

MetricResult faithfulness_correlation(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                      const Tensor& attr, const FaithfulnessCorrelationOptions& options) {
  check_map("faithfulness_correlation", x.shape(), attr);
  return faithfulness_correlation(probe_faithfulness_correlation(model, x, targets, options), attr);
}

// ---- Faithfulness Estimate and Monotonicity Correlation -----------------------------------

PatchProbe probe_faithfulness_estimate(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                       const FaithfulnessEstimateOptions& options) {
  const std::string metric = "faithfulness_estimate";
  check_batch(metric, x, targets);
  check_images(metric, x.shape());
  const Tensor xc = dense(x);
  const int64_t n = xc.size(0), channels = xc.size(1), height = xc.size(2), width = xc.size(3);
  const int64_t d = channels * height * width;
  const int64_t size = options.patch_size > 0 ? options.patch_size : default_patch_size(height);
  const std::vector<Patch> grid = patch_grid(height, width, size);
  const int64_t patches = static_cast<int64_t>(grid.size());
  const float* px = xc.data();
  const std::vector<double> clean = clean_logits(model, metric, xc, targets, options.batch_size);
  const std::vector<double> perturbed = target_logits(
      model, metric, example_shape(xc.shape()), n * patches, options.batch_size,
      [&](int64_t j) { return targets[static_cast<size_t>(j / patches)]; },
      [&](int64_t j, float* dst) {
        const int64_t i = j / patches;
        std::copy(px + i * d, px + (i + 1) * d, dst);
        fill_patch(dst, channels, height, width, grid[static_cast<size_t>(j % patches)],
                   [&](int64_t, int64_t, int64_t) { return options.baseline; });
      });
  PatchProbe probe{metric, xc.shape(), size, std::vector<double>(perturbed.size())};
  for (size_t j = 0; j < perturbed.size(); ++j)
    probe.responses[j] = clean[j / static_cast<size_t>(patches)] - perturbed[j];
  return probe;
}

PatchProbe probe_monotonicity(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                              InputRange range, const MonotonicityOptions& options) {
  const std::string metric = "monotonicity_correlation";
  check_batch(metric, x, targets);
  check_images(metric, x.shape());
  check(options.samples > 0, metric, ": samples must be positive, got ", options.samples);
  const Tensor xc = dense(x);
  const int64_t n = xc.size(0), channels = xc.size(1), height = xc.size(2), width = xc.size(3);
  const int64_t d = channels * height * width;
  const int64_t size = options.patch_size > 0 ? options.patch_size : default_patch_size(height);
  const std::vector<Patch> grid = patch_grid(height, width, size);
  const int64_t patches = static_cast<int64_t>(grid.size()), samples = options.samples;
  const int64_t per_example = patches * samples;
  const float* px = xc.data();
  const std::vector<double> clean = clean_logits(model, metric, xc, targets, options.batch_size);
  const std::vector<double> perturbed = target_logits(
      model, metric, example_shape(xc.shape()), n * per_example, options.batch_size,
      [&](int64_t j) { return targets[static_cast<size_t>(j / per_example)]; },
      [&](int64_t j, float* dst) {
        const int64_t i = j / per_example, p = (j / samples) % patches, s = j % samples;
        std::copy(px + i * d, px + (i + 1) * d, dst);
        const Patch& patch = grid[static_cast<size_t>(p)];
        Generator gen = keyed_generator(options.seed, RandomStream::monotonicity,
                                        {static_cast<uint64_t>(options.first_example + i), static_cast<uint64_t>(p),
                                         static_cast<uint64_t>(s)});
        const Tensor noise = uniform({channels, patch.height, patch.width}, range.lo, range.hi, gen);
        const float* pn = noise.data();
        fill_patch(dst, channels, height, width, patch,
                   [&](int64_t c, int64_t y, int64_t x) { return pn[(c * patch.height + y) * patch.width + x]; });
      });
  PatchProbe probe{metric, xc.shape(), size, std::vector<double>(static_cast<size_t>(n * patches), 0.0)};
  for (size_t j = 0; j < perturbed.size(); ++j) {
    const double change = perturbed[j] - clean[j / static_cast<size_t>(per_example)];
    probe.responses[j / static_cast<size_t>(samples)] += change * change / static_cast<double>(samples);
  }
  return probe;
}

namespace {

// Correlates each example's per-patch attribution sums (of |attr| when `absolute`) with the
// probe's per-patch responses.
MetricResult score_patches(const std::string& metric, const PatchProbe& probe, const Tensor& attr, bool absolute,
                           double (*correlation)(std::span<const double>, std::span<const double>)) {
  check(probe.metric == metric, metric, ": the probe was made for ", probe.metric);
  check_map(metric, probe.shape, attr);
  const Tensor a_map = dense(attr);
  const int64_t n = probe.shape[0], channels = probe.shape[1], height = probe.shape[2], width = probe.shape[3];
  const int64_t d = channels * height * width;
  const std::vector<Patch> grid = patch_grid(height, width, probe.patch_size);
  const size_t patches = grid.size();
  const float* pa = a_map.data();
  std::vector<double> values(static_cast<size_t>(n));
  for_each_example(n, [&](int64_t i) {
    std::vector<double> sums(patches);
    for (size_t p = 0; p < patches; ++p)
      sums[p] = sum_patch(channels, height, width, grid[p], [&](int64_t, int64_t, int64_t, int64_t flat) {
        const double v = pa[i * d + flat];
        return absolute ? std::fabs(v) : v;
      });
    values[static_cast<size_t>(i)] = correlation(sums, std::span<const double>(probe.responses.data() + i * patches, patches));
  });
  return {metric_info(metric), values};
}

}  // namespace

MetricResult faithfulness_estimate(const PatchProbe& probe, const Tensor& attr) {
  return score_patches("faithfulness_estimate", probe, attr, false, pearson);
}

MetricResult monotonicity_correlation(const PatchProbe& probe, const Tensor& attr) {
  return score_patches("monotonicity_correlation", probe, attr, true, spearman);
}

MetricResult faithfulness_estimate(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                   const Tensor& attr, const FaithfulnessEstimateOptions& options) {
  check_map("faithfulness_estimate", x.shape(), attr);
  return faithfulness_estimate(probe_faithfulness_estimate(model, x, targets, options), attr);
}

MetricResult monotonicity_correlation(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                      const Tensor& attr, InputRange range, const MonotonicityOptions& options) {
  check_map("monotonicity_correlation", x.shape(), attr);
  return monotonicity_correlation(probe_monotonicity(model, x, targets, range, options), attr);
}

// ---- Sparseness and Complexity ------------------------------------------------------------

namespace {

// Applies score(|attr| of one example, in double) to every example of the map.
MetricResult score_magnitudes(const std::string& metric, const Tensor& attr,
                              const std::function<double(std::vector<double>&)>& score) {
  check(attr.defined() && attr.dim() >= 2, metric, ": attribution must be a batch (N, ...), got ", shape_text(attr));
  const Tensor a_map = dense(attr);
  const int64_t n = a_map.size(0), d = numel(example_shape(a_map.shape()));
  const float* pa = a_map.data();
  std::vector<double> values(static_cast<size_t>(n));
  for_each_example(n, [&](int64_t i) {
    std::vector<double> v(static_cast<size_t>(d));
    for (int64_t k = 0; k < d; ++k) v[static_cast<size_t>(k)] = std::fabs(double(pa[i * d + k]));
    values[static_cast<size_t>(i)] = score(v);
  });
  return {metric_info(metric), values};
}

}  // namespace

MetricResult sparseness(const Tensor& attr) {
  return score_magnitudes("sparseness", attr, [](std::vector<double>& v) {
    // Quantus leaves an all-zero map unnormalised: it becomes uniform, Gini 0.
    const double top = *std::max_element(v.begin(), v.end());
    for (double& e : v) e = (top > 0 ? e / top : e) + 1e-7;
    std::sort(v.begin(), v.end());
    const double d = static_cast<double>(v.size());
    double weighted = 0, total = 0;
    for (size_t k = 0; k < v.size(); ++k) {
      weighted += (2.0 * static_cast<double>(k + 1) - d - 1.0) * v[k];
      total += v[k];
    }
    return weighted / (d * total);
  });
}

MetricResult complexity(const Tensor& attr) {
  return score_magnitudes("complexity", attr, [](std::vector<double>& v) {
    const double total = std::accumulate(v.begin(), v.end(), 0.0);
    if (total == 0) return kNaN;
    double entropy = 0;
    for (double e : v)
      if (e > 0) entropy -= (e / total) * std::log(e / total);
    return entropy;
  });
}

}  // namespace adjoint
