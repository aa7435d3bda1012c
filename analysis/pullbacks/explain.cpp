#include "analysis/pullbacks/explain.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "analysis/common/input_search.h"
#include "engine/autograd.h"
#include "engine/recording_scope.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

// Elements per parallel chunk for the elementwise loops below.
constexpr int64_t kGrain = 1 << 15;

// ---- shared machinery ----------------------------------------------------------------

void check_ready(const char* method, const Model& model, const Tensor& x, const std::vector<int64_t>& targets) {
  check(!model.training(), method, ": the model is in training mode; call model.train(false) before explaining");
  check(grad_enabled(), method, ": autograd recording is off (called inside NoGrad)");
  check(x.defined() && x.dim() >= 2 && x.size(0) > 0, method, ": expects a non-empty batch (N, ...), got ",
        x.defined() ? x.shape() : Shape{});
  check(static_cast<int64_t>(targets.size()) == x.size(0), method, ": ", targets.size(), " targets for a batch of ",
        x.size(0), " examples ", x.shape());
}

// out[i] = fn(i) over a new tensor of `shape`.
template <class Fn>
Tensor generate(const Shape& shape, Fn fn) {
  Tensor out = Tensor::empty(shape);
  float* po = out.data();
  parallel_for(out.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = fn(i);
  });
  return out;
}

// The cotangent of the logits (rows, classes): row r is the one-hot e_{targets[r]}; a
// target of -1 leaves its row zero (DeepLift's baseline rows).
Tensor one_hot_rows(const char* method, const std::vector<int64_t>& targets, const Tensor& logits) {
  check(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(targets.size()), method,
        ": the model gave logits ", logits.shape(), " for ", targets.size(), " rows; expected (rows, classes)");
  const int64_t classes = logits.size(1);
  Tensor u = Tensor::zeros(logits.shape());
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == -1) continue;
    check(targets[r] >= 0 && targets[r] < classes, method, ": target class ", targets[r], " of example ", r,
          " is outside [0, ", classes, ")");
    u.data()[static_cast<int64_t>(r) * classes + targets[r]] = 1.0f;
  }
  return u;
}

// The input cotangent of the target logits under `transport`: one forward pass and one
// backward pass that asks for the input alone (no parameter gradient is computed).
Tensor input_cotangent(const char* method, const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
                       const Transport& transport) {
  Tensor leaf = x.contiguous().detach();
  leaf.requires_grad_();
  // Recorded for the input's cotangent alone: the parameters are constants, so each op keeps
  // only what the input's cotangent reads.
  const RecordingFor input_only(leaf);
  Tensor logits = model.forward(leaf);
  return grad(logits, {leaf}, one_hot_rows(method, targets, logits), transport)[0];
}

}  // namespace

namespace {

// Rows of x within max_batch and `max_elements` input elements, at least one.
int64_t rows_within(const ExplainOptions& o, const Tensor& x, int64_t max_elements, const char* option) {
  check(o.max_batch > 0, "explain: max_batch must be positive, got ", o.max_batch);
  check(max_elements > 0, "explain: ", option, " must be positive, got ", max_elements);
  const int64_t example_numel = x.numel() / x.size(0);
  return std::max<int64_t>(1, std::min(o.max_batch, max_elements / example_numel));
}

}  // namespace

int64_t rows_per_pass(const ExplainOptions& o, const Tensor& x) {
  return rows_within(o, x, o.max_pass_elements, "max_pass_elements");
}

int64_t sample_rows_per_pass(const ExplainOptions& o, const Tensor& x) {
  return rows_within(o, x, o.max_sample_pass_elements, "max_sample_pass_elements");
}

namespace {

// `pass(rows, first)` over consecutive blocks of x's rows, at most `per_pass` each, its
// results (each of its rows' shape) put together in order. A pass's recorded forward state
// grows with its rows and is freed before the next pass, so the memory a method peaks at
// (and the pages the kernel faults in for it) is one pass's, however large the batch. Each
// row's result is the same bits in any pass: no kernel mixes the rows of a batch.
template <class Pass>
Tensor in_passes(const Tensor& x, int64_t per_pass, Pass pass) {
  const int64_t N = x.size(0);
  if (N <= per_pass) return pass(x, 0).contiguous();
  const Tensor xc = x.contiguous();
  const int64_t row = xc.numel() / N;
  Tensor out;
  for (int64_t first = 0; first < N; first += per_pass) {
    const int64_t count = std::min(per_pass, N - first);
    Shape shape = xc.shape();
    shape[0] = count;
    Tensor block = Tensor::empty(shape);  // a copy: a pass's inputs are a leaf of their own
    std::copy(xc.data() + first * row, xc.data() + (first + count) * row, block.data());
    const Tensor part = pass(block, first).contiguous();
    if (!out.defined()) {
      Shape whole = part.shape();
      whole[0] = N;
      out = Tensor::empty(whole);
    }
    const int64_t part_row = part.numel() / count;
    std::copy(part.data(), part.data() + part.numel(), out.data() + first * part_row);
  }
  return out;
}

// The baseline x0 as a dense tensor of x's shape.
Tensor resolve_baseline(const char* method, const Tensor& x, const Tensor& baseline) {
  if (!baseline.defined()) return Tensor::zeros(x.shape());
  const Shape& s = x.shape();
  const Shape one_example(s.begin() + 1, s.end());
  Shape with_unit_batch = s;
  with_unit_batch[0] = 1;
  if (baseline.shape() == s) return baseline.contiguous();
  check(baseline.shape() == one_example || baseline.shape() == with_unit_batch, method, ": baseline ",
        baseline.shape(), " matches neither the batch ", s, " nor one example ", one_example);
  const Tensor b = baseline.contiguous();
  const float* pb = b.data();
  const int64_t per_example = b.numel();
  return generate(s, [=](int64_t i) { return pb[i % per_example]; });
}

// A copy of rows [0, count) of a contiguous batch.
Tensor leading_rows(const Tensor& t, int64_t count) {
  Shape shape = t.shape();
  const int64_t row = t.numel() / shape[0];
  shape[0] = count;
  Tensor out = Tensor::empty(shape);
  std::copy(t.data(), t.data() + count * row, out.data());
  return out;
}

// ---- the methods ---------------------------------------------------------------------

// One transport of the input, in passes of rows_per_pass rows.
Tensor run_transport(const char* method, const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
                     const Transport& transport, const ExplainOptions& o) {
  check_ready(method, model, x, targets);
  return in_passes(x, rows_per_pass(o, x), [&](const Tensor& rows, int64_t first) {
    const std::vector<int64_t> mine(targets.begin() + first, targets.begin() + first + rows.size(0));
    return input_cotangent(method, model, rows, mine, transport);
  });
}

Tensor soft_pullback(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  return run_transport("soft_pullback", m, x, t, Transport::soft_pullback(o.temperatures), o);
}

Tensor pullback(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  return run_transport("pullback", m, x, t, Transport::pullback(), o);
}

Tensor gradient(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  return run_transport("gradient", m, x, t, Transport::gradient(), o);
}

Tensor guided_backprop(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  return run_transport("guided_backprop", m, x, t, Transport::guided(), o);
}

Tensor input_x_gradient(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  const Tensor g = run_transport("input_x_gradient", m, x, t, Transport::gradient(), o);
  const Tensor xc = x.contiguous();
  const float *px = xc.data(), *pg = g.data();
  return generate(x.shape(), [=](int64_t i) { return px[i] * pg[i]; });
}

Tensor pullback_ascent(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  return ascent(m, x, t, o, true).attribution;
}

Tensor gradient_ascent(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  return ascent(m, x, t, o, false).attribution;
}

// Mean of Σ_k weights[k]·∂f_c/∂x at points(k), k < count, evaluated in batches of whole
// samples: sample k of every example sits in one forward pass. `points(k0, k1, dst)` writes
// the evaluation points of samples k0..k1−1 of the whole batch (each of x's shape, one
// after another) into dst, all of a pass at once so that their generation runs on every
// thread rather than one sample at a time.
template <class Points>
Tensor weighted_gradient_sum(const char* method, const Model& model, const Tensor& x,
                             const std::vector<int64_t>& targets, const std::vector<double>& weights,
                             const ExplainOptions& o, Points points) {
  const int64_t N = x.size(0), count = static_cast<int64_t>(weights.size());
  const int64_t batch_numel = x.numel();
  const int64_t per_pass = std::max<int64_t>(1, sample_rows_per_pass(o, x) / N);  // samples per forward
  Tensor total = Tensor::zeros(x.shape());
  float* pt = total.data();
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < std::min(count, per_pass); ++k) rows.insert(rows.end(), targets.begin(), targets.end());
  for (int64_t k0 = 0; k0 < count; k0 += per_pass) {
    const int64_t k1 = std::min(count, k0 + per_pass);
    Shape shape = x.shape();
    shape[0] = (k1 - k0) * N;
    Tensor batch = Tensor::empty(shape);
    points(k0, k1, batch.data());
    rows.resize(static_cast<size_t>((k1 - k0) * N));
    const Tensor g = input_cotangent(method, model, batch, rows, Transport::gradient());
    const float* pg = g.data();
    // One sweep over the total per pass, the samples summed in order (as before, one at a time).
    parallel_for(batch_numel, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t k = k0; k < k1; ++k) {
        const float w = static_cast<float>(weights[k]);
        const float* gk = pg + (k - k0) * batch_numel;
        for (int64_t i = b; i < e; ++i) pt[i] += w * gk[i];
      }
    });
  }
  return total;
}

Tensor smoothgrad(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  check_ready("smoothgrad", m, x, t);
  check(o.smoothgrad_samples > 0, "smoothgrad: needs at least one sample, got ", o.smoothgrad_samples);
  const float sigma = o.smoothgrad_sigma * o.range.width();
  const Tensor xc = x.contiguous();
  const int64_t n = o.smoothgrad_samples, numel = x.numel();
  // Sample k's noise is the k-th draw of x's shape from one generator, so it does not
  // depend on how the samples are grouped into passes. normal_noise rather than normal():
  // the draws are as many as the pixels of every copy, so a double log and cosine per draw
  // would weigh against the gradients themselves.
  Generator gen(o.seed);
  const std::vector<double> mean(n, 1.0 / double(n));
  const float* px = xc.data();
  return weighted_gradient_sum("smoothgrad", m, xc, t, mean, o, [&](int64_t k0, int64_t k1, float* dst) {
    for (int64_t k = k0; k < k1; ++k) {
      const Tensor noise = normal_noise(x.shape(), 0.0f, sigma, gen);
      const float* pn = noise.data();
      float* copy = dst + (k - k0) * numel;
      parallel_for(numel, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) copy[i] = px[i] + pn[i];
      });
    }
  });
}

Tensor integrated_gradients(const Model& m, const Tensor& x, const std::vector<int64_t>& t,
                            const ExplainOptions& o) {
  check_ready("integrated_gradients", m, x, t);
  const Quadrature q = quadrature(o.ig_rule, o.ig_steps);
  const Tensor xc = x.contiguous();
  const Tensor x0 = resolve_baseline("integrated_gradients", xc, o.baseline);
  const float *px = xc.data(), *p0 = x0.data();
  const int64_t numel = x.numel();
  const Tensor path_mean = weighted_gradient_sum("integrated_gradients", m, xc, t, q.weights, o,
                                                 [&](int64_t k0, int64_t k1, float* dst) {
    parallel_for((k1 - k0) * numel, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        const float a = static_cast<float>(q.nodes[k0 + j / numel]);
        const int64_t i = j % numel;
        dst[j] = p0[i] + a * (px[i] - p0[i]);
      }
    });
  });
  const float* pm = path_mean.data();
  return generate(x.shape(), [=](int64_t i) { return (px[i] - p0[i]) * pm[i]; });
}

// DeepLift (rescale rule): the forward runs on [x; x0] and the DeepLift transport pairs
// each example's activations with its baseline's; the baseline rows get no cotangent at
// the logits. Attribution (x − x0) ⊙ the input rows' cotangent.
Tensor deeplift(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  check_ready("deeplift", m, x, t);
  const int64_t N = x.size(0), numel = x.numel();
  const Tensor xc = x.contiguous();
  const Tensor x0 = resolve_baseline("deeplift", xc, o.baseline);
  Shape shape = x.shape();
  shape[0] = 2 * N;
  Tensor both = Tensor::empty(shape);
  std::copy(xc.data(), xc.data() + numel, both.data());
  std::copy(x0.data(), x0.data() + numel, both.data() + numel);
  std::vector<int64_t> rows = t;
  rows.insert(rows.end(), N, -1);
  const Tensor g = leading_rows(input_cotangent("deeplift", m, both, rows, Transport::deeplift()), N);
  const float *px = xc.data(), *p0 = x0.data(), *pg = g.data();
  return generate(x.shape(), [=](int64_t i) { return (px[i] - p0[i]) * pg[i]; });
}

// Grad-CAM upsampled to the input and repeated over its channels.
Tensor gradcam(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  check(x.defined() && x.dim() == 4, "gradcam: expects images (N, C, H, W), got ", x.defined() ? x.shape() : Shape{});
  const std::string block = o.gradcam_block.empty() ? default_gradcam_block(m, x.shape()) : o.gradcam_block;
  const Tensor cam = bilinear_resize(gradcam_map(m, x, t, block), x.size(2), x.size(3));
  const int64_t C = x.size(1), plane = x.size(2) * x.size(3);
  const float* pc = cam.data();
  return generate(x.shape(), [=](int64_t i) { return pc[(i / (C * plane)) * plane + i % plane]; });
}

Tensor guided_gradcam(const Model& m, const Tensor& x, const std::vector<int64_t>& t, const ExplainOptions& o) {
  const Tensor cam = gradcam(m, x, t, o);
  const Tensor guided = run_transport("guided_gradcam", m, x, t, Transport::guided(), o);
  const float *pc = cam.data(), *pg = guided.data();
  return generate(x.shape(), [=](int64_t i) { return pc[i] * pg[i]; });
}

using Method = Tensor (*)(const Model&, const Tensor&, const std::vector<int64_t>&, const ExplainOptions&);
struct NamedMethod {
  const char* name;
  Method run;
  bool reads_gradcam_block = false;  // resolves ExplainOptions::gradcam_block when it is empty
  // The transport of a method that is one transport of the input; null for the others.
  Transport (*one_pass)(const ExplainOptions&) = nullptr;
};

Transport soft_pullback_transport(const ExplainOptions& o) { return Transport::soft_pullback(o.temperatures); }
Transport pullback_transport(const ExplainOptions&) { return Transport::pullback(); }
Transport gradient_transport(const ExplainOptions&) { return Transport::gradient(); }
Transport guided_transport(const ExplainOptions&) { return Transport::guided(); }

const std::vector<NamedMethod>& method_table() {
  static const std::vector<NamedMethod> table = {
      {"soft_pullback", soft_pullback, false, soft_pullback_transport},
      {"pullback", pullback, false, pullback_transport},
      {"pullback_ascent", pullback_ascent},
      {"gradient_ascent", gradient_ascent},
      {"gradient", gradient, false, gradient_transport},
      {"input_x_gradient", input_x_gradient},
      {"smoothgrad", smoothgrad},
      {"integrated_gradients", integrated_gradients},
      {"guided_backprop", guided_backprop, false, guided_transport},
      {"gradcam", gradcam, true},
      {"guided_gradcam", guided_gradcam, true},
      {"deeplift", deeplift},
  };
  return table;
}

const NamedMethod& find_method(const std::string& name) {
  std::string names;
  for (const NamedMethod& m : method_table()) {
    if (name == m.name) return m;
    names += cat(" ", m.name);
  }
  throw UsageError(cat("unknown explanation method '", name, "'; known:", names));
}

// ---- Gauss–Legendre ------------------------------------------------------------------

// P_n(t) and P_n'(t) by the three-term recurrence (k+1)P_{k+1} = (2k+1)tP_k − kP_{k−1}.
std::pair<double, double> legendre(int64_t n, double t) {
  double p0 = 1.0, p1 = t;
  for (int64_t k = 1; k < n; ++k) {
    const double p2 = ((2.0 * double(k) + 1.0) * t * p1 - double(k) * p0) / double(k + 1);
    p0 = p1;
    p1 = p2;
  }
  const double derivative = double(n) * (t * p1 - p0) / (t * t - 1.0);
  return {p1, derivative};
}

Quadrature gauss_legendre(int64_t n) {
  Quadrature q;
  for (int64_t i = 0; i < n; ++i) {
    // Newton's method from Tricomi's estimate of the i-th root (descending on [−1, 1]).
    double t = std::cos(M_PI * (double(i) + 0.75) / (double(n) + 0.5));
    for (int iter = 0; iter < 100; ++iter) {
      const auto [p, d] = legendre(n, t);
      const double step = p / d;
      t -= step;
      if (std::fabs(step) < 1e-15) break;
    }
    const double dp = legendre(n, t).second;
    // Map [−1, 1] to [0, 1]: node (1 + t)/2, weight halved.
    q.nodes.push_back(0.5 * (1.0 + t));
    q.weights.push_back(1.0 / ((1.0 - t * t) * dp * dp));
  }
  std::reverse(q.nodes.begin(), q.nodes.end());  // ascending
  std::reverse(q.weights.begin(), q.weights.end());
  return q;
}

}  // namespace

Quadrature quadrature(const std::string& rule, int64_t n) {
  if (rule == "trapezoid") {
    check(n >= 2, "integrated gradients: the trapezoid rule needs at least 2 points, got ", n);
    Quadrature q;
    for (int64_t k = 0; k < n; ++k) {
      q.nodes.push_back(double(k) / double(n - 1));
      q.weights.push_back((k == 0 || k == n - 1 ? 0.5 : 1.0) / double(n - 1));
    }
    return q;
  }
  if (rule == "gauss-legendre") {
    check(n >= 1, "integrated gradients: Gauss–Legendre needs at least 1 node, got ", n);
    return gauss_legendre(n);
  }
  throw UsageError(cat("integrated gradients: unknown rule '", rule, "' (trapezoid, gauss-legendre)"));
}

std::vector<std::string> explanation_methods() {
  std::vector<std::string> names;
  for (const NamedMethod& m : method_table()) names.push_back(m.name);
  return names;
}

Tensor explain(const std::string& method, const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
               const ExplainOptions& options) {
  return find_method(method).run(model, x, targets, options);
}

// The highest-scoring class of each row of contiguous (N, classes) logits (the first on ties).
static std::vector<int64_t> classes_of(const Tensor& logits) {
  std::vector<int64_t> classes;
  const int64_t C = logits.size(1);
  for (int64_t n = 0; n < logits.size(0); ++n) {
    const float* row = logits.data() + n * C;
    classes.push_back(std::max_element(row, row + C) - row);
  }
  return classes;
}

bool explains_in_one_pass(const std::string& method) { return find_method(method).one_pass != nullptr; }

Tensor explain_predicted(const std::string& method, const Model& model, const Tensor& x,
                         std::vector<int64_t>& predicted, const ExplainOptions& options) {
  const NamedMethod& found = find_method(method);
  check(found.one_pass != nullptr, "explain_predicted: ", method, " is not one transport of the input");
  check(x.defined() && x.dim() >= 2 && x.size(0) > 0, method, ": expects a non-empty batch (N, ...), got ",
        x.defined() ? x.shape() : Shape{});
  check_ready(found.name, model, x, std::vector<int64_t>(size_t(x.size(0)), 0));
  const Transport transport = found.one_pass(options);
  predicted.clear();
  return in_passes(x, rows_per_pass(options, x), [&](const Tensor& rows, int64_t) {
    Tensor leaf = rows.contiguous().detach();
    leaf.requires_grad_();
    const Tensor logits = model.forward(leaf);
    check(logits.dim() == 2, method, ": the model gave logits ", logits.shape(), ", expected (N, classes)");
    const std::vector<int64_t> mine = classes_of(logits.detach().contiguous());
    predicted.insert(predicted.end(), mine.begin(), mine.end());
    return grad(logits, {leaf}, one_hot_rows(found.name, mine, logits), transport)[0];
  });
}

Explainer make_explainer(const std::string& method, const Model& model, const ExplainOptions& options) {
  const NamedMethod& found = find_method(method);
  const Method run = found.run;
  if (!found.reads_gradcam_block || !options.gradcam_block.empty())
    return [run, &model, options](const Tensor& x, const std::vector<int64_t>& targets) {
      return run(model, x, targets, options);
    };
  // Grad-CAM's default block depends on the image shape and takes a probe forward to find,
  // so the explainer finds it once per shape, not on every call (max-sensitivity calls it
  // on every perturbed batch). Shapes only: re-initialised weights do not change it.
  struct BlockPerShape {
    std::mutex lock;
    std::map<Shape, std::string> block;
  };
  auto resolved = std::make_shared<BlockPerShape>();
  return [run, &model, options, resolved](const Tensor& x, const std::vector<int64_t>& targets) {
    if (!x.defined() || x.dim() != 4) return run(model, x, targets, options);  // run's own check reports it
    const Shape image{1, x.size(1), x.size(2), x.size(3)};
    ExplainOptions o = options;
    {
      std::lock_guard guard(resolved->lock);
      auto it = resolved->block.find(image);  // stored only once found: a failed probe is not cached
      if (it == resolved->block.end()) it = resolved->block.emplace(image, default_gradcam_block(model, image)).first;
      o.gradcam_block = it->second;
    }
    return run(model, x, targets, o);
  };
}

std::vector<int64_t> predicted_classes(const Model& model, const Tensor& x) {
  check(!model.training(), "predicted_classes: the model is in training mode; call model.train(false) first");
  Tensor logits;
  {
    NoGrad no_grad;
    logits = model.forward(x).contiguous();
  }
  check(logits.dim() == 2, "predicted_classes: the model gave logits ", logits.shape(), ", expected (N, classes)");
  return classes_of(logits);
}

float default_ascent_alpha(const Tensor& x, const InputRange& range) {
  const double D = double(x.numel() / x.size(0));
  return static_cast<float>(20.0 * std::sqrt(D / 150528.0) * (range.width() / 2.0));
}

AscentResult ascent(const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
                    const ExplainOptions& o, bool soft) {
  const char* method = soft ? "pullback_ascent" : "gradient_ascent";
  check_ready(method, model, x, targets);
  check(o.ascent_steps >= 0, method, ": the number of steps must be non-negative, got ", o.ascent_steps);
  const Transport transport = soft ? Transport::soft_pullback(o.temperatures) : Transport::gradient();
  const float alpha = o.ascent_alpha > 0 ? o.ascent_alpha : default_ascent_alpha(x, o.range);
  const Tensor x0 = x.contiguous();
  // The input-space optimiser (analysis/common/input_search.h) with its normalised L2 step,
  // minimising the negated target logit: each step is x + α·ν/‖ν‖ with ν the cotangent of
  // the target logit under `transport`. A zero cotangent (a dead example, or a target of
  // −1) gives no direction, so that example stays put. The last iterate is x_K.
  InputSearchOptions search;
  search.rule = "l2";
  search.steps = o.ascent_steps;
  search.step = alpha;
  search.range = o.range;
  search.clamp = o.ascent_clip;
  search.keep_best = false;
  search.transport = transport;
  const Tensor xt = minimise_per_example(
                        [&](const Tensor& leaf) {
                          const Tensor logits = model.forward(leaf);
                          return -sum(logits * one_hot_rows(method, targets, logits), {1});
                        },
                        x0, search)
                        .best;
  const float *pk = xt.data(), *p0 = x0.data();
  return {generate(x.shape(), [=](int64_t i) { return pk[i] - p0[i]; }), xt};
}

// ---- Grad-CAM --------------------------------------------------------------------------

std::string default_gradcam_block(const Model& model, const Shape& input) {
  const auto& blocks = model.blocks();
  check(blocks.size() >= 2, "gradcam: model ", model.config().arch, " has ", blocks.size(),
        " blocks; Grad-CAM needs one before the head");
  // A family that fixes its block says so (a ViT: the input of its last transformer block).
  if (!model.facts().gradcam_block.empty()) return model.facts().gradcam_block;
  // The blocks' output sizes for one input of this shape, in eval mode (statistics fixed).
  check(input.size() == 4, "gradcam: expects images (N, C, H, W), got ", input);
  Model& m = const_cast<Model&>(model);
  const bool was_training = m.training();
  m.train(false);
  NoGrad no_grad;
  Tensor h = Tensor::zeros({1, input[1], input[2], input[3]});
  size_t chosen = blocks.size() - 2;
  bool found = false;
  for (size_t i = 0; i + 1 < blocks.size(); ++i) {
    h = model.run(h, i, i + 1);
    if (h.dim() == 4 && h.size(2) * h.size(3) > 1) chosen = i, found = true;
  }
  m.train(was_training);
  return blocks[found ? chosen : blocks.size() - 2].name;
}

Tensor gradcam_map(const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
                   const std::string& block) {
  check_ready("gradcam", model, x, targets);
  check(x.dim() == 4, "gradcam: expects images (N, C, H, W), got ", x.shape());
  const size_t b = model.block_index(block);
  check(b + 1 < model.num_blocks(), "gradcam: block '", block, "' is the last one; it gives the logits");
  Tensor features;
  {
    NoGrad no_grad;  // the front part needs no history: the backward stops at the block
    features = model.run(x, 0, b + 1).contiguous();
  }
  Tensor leaf = features.detach();
  leaf.requires_grad_();
  const Tensor logits = model.run(leaf, b + 1, model.num_blocks());
  const Tensor g = grad(logits, {leaf}, one_hot_rows("gradcam", targets, logits), Transport::gradient())[0];

  // Where channel k of pixel p of example n lives: n·example + first + p·pixel + k·channel.
  const int64_t N = x.size(0);
  int64_t channels = 0, h = 0, w = 0, channel_stride = 0, pixel_stride = 0, first = 0;
  if (features.dim() == 4) {  // (N, C, h, w)
    channels = features.size(1), h = features.size(2), w = features.size(3);
    channel_stride = h * w, pixel_stride = 1;
  } else if (features.dim() == 3) {  // (N, 1 + h·w, D): class token, then the patch grid
    const int64_t tokens = features.size(1) - 1;
    h = std::lround(std::sqrt(double(tokens) * double(x.size(2)) / double(x.size(3))));
    w = h > 0 ? tokens / h : 0;
    check(tokens > 0 && h * w == tokens, "gradcam: block '", block, "' gives ", features.shape(),
          "; its tokens after the class token do not form a grid with the aspect of ", x.shape());
    channels = features.size(2), channel_stride = 1, pixel_stride = channels, first = channels;
  } else {
    throw Error(cat("gradcam: block '", block, "' gives ", features.shape(),
                    "; expected (N, C, h, w) feature maps or (N, 1 + h·w, D) tokens"));
  }
  const int64_t example = features.numel() / N, pixels = h * w;
  Tensor cam = Tensor::empty({N, h, w});
  const float *pa = features.data(), *pg = g.data();
  float* pc = cam.data();
  parallel_for(N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<double> weight(channels);
    for (int64_t n = n0; n < n1; ++n) {
      const float* a = pa + n * example + first;
      const float* gn = pg + n * example + first;
      for (int64_t k = 0; k < channels; ++k) {
        double s = 0;
        for (int64_t p = 0; p < pixels; ++p) s += gn[p * pixel_stride + k * channel_stride];
        weight[k] = s / double(pixels);
      }
      for (int64_t p = 0; p < pixels; ++p) {
        double s = 0;
        for (int64_t k = 0; k < channels; ++k) s += weight[k] * a[p * pixel_stride + k * channel_stride];
        pc[n * pixels + p] = static_cast<float>(std::max(s, 0.0));
      }
    }
  });
  return cam;
}

Tensor bilinear_resize(const Tensor& maps, int64_t H, int64_t W) {
  check(maps.dim() == 3 && H > 0 && W > 0, "bilinear_resize: expects maps (N, h, w) and a positive size, got ",
        maps.shape(), " to ", H, "x", W);
  const Tensor src = maps.contiguous();
  const int64_t N = src.size(0), h = src.size(1), w = src.size(2);
  // Source coordinate of output index i (align_corners = False): (i + ½)·in/out − ½,
  // clamped at 0; the upper neighbour is clamped at the last row/column.
  struct Tap {
    int64_t lo, hi;
    float frac;
  };
  auto taps = [](int64_t in, int64_t out) {
    std::vector<Tap> t(out);
    const double scale = double(in) / double(out);
    for (int64_t i = 0; i < out; ++i) {
      const double s = std::max(0.0, (double(i) + 0.5) * scale - 0.5);
      const int64_t lo = std::min<int64_t>(static_cast<int64_t>(s), in - 1);
      t[i] = {lo, std::min(lo + 1, in - 1), static_cast<float>(s - double(lo))};
    }
    return t;
  };
  const std::vector<Tap> rows = taps(h, H), cols = taps(w, W);
  Tensor out = Tensor::empty({N, H, W});
  const float* ps = src.data();
  float* po = out.data();
  parallel_for(N * H, 16, [&](int64_t b, int64_t e) {
    for (int64_t nr = b; nr < e; ++nr) {
      const float* plane = ps + (nr / H) * h * w;
      const Tap& r = rows[nr % H];
      for (int64_t c = 0; c < W; ++c) {
        const Tap& q = cols[c];
        const float top = plane[r.lo * w + q.lo] * (1 - q.frac) + plane[r.lo * w + q.hi] * q.frac;
        const float bottom = plane[r.hi * w + q.lo] * (1 - q.frac) + plane[r.hi * w + q.hi] * q.frac;
        po[nr * W + c] = top * (1 - r.frac) + bottom * r.frac;
      }
    }
  });
  return out;
}

}  // namespace adjoint
