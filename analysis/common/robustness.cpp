#include "analysis/common/robustness.h"

#include <algorithm>
#include <cmath>

#include "analysis/common/input_search.h"
#include "engine/autograd.h"
#include "engine/data/transform.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/reduce.h"
#include "ops/softmax.h"

namespace adjoint {

namespace {

// ---- the norms ---------------------------------------------------------------------------
// x, clean: contiguous batches of one shape; every example is projected on its own.

// δ = x − clean clipped to [−ε, ε] per pixel.
void project_box(Tensor& x, const Tensor& clean, float eps) {
  float* px = x.data();
  const float* pc = clean.data();
  parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) px[i] = pc[i] + std::clamp(px[i] - pc[i], -eps, eps);
  });
}

// δ = x − clean scaled down to ‖δ‖₂ = ε per example when it is longer.
void project_ball(Tensor& x, const Tensor& clean, float eps) {
  const int64_t N = x.size(0), D = x.numel() / N;
  float* px = x.data();
  const float* pc = clean.data();
  parallel_for(N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      double norm2 = 0;
      for (int64_t i = n * D; i < (n + 1) * D; ++i) norm2 += double(px[i] - pc[i]) * double(px[i] - pc[i]);
      const double norm = std::sqrt(norm2);
      if (norm <= eps) continue;
      const float scale = float(eps / norm);
      for (int64_t i = n * D; i < (n + 1) * D; ++i) px[i] = pc[i] + scale * (px[i] - pc[i]);
    }
  });
}

// clean + δ, δ uniform in the ε-box.
Tensor start_in_box(const Tensor& clean, float eps, Generator& gen) { return clean + uniform(clean.shape(), -eps, eps, gen); }

// clean + δ, δ uniform on the ε-sphere: a normal direction per example scaled to length ε.
Tensor start_on_sphere(const Tensor& clean, float eps, Generator& gen) {
  const Tensor direction = normal(clean.shape(), 0.0f, 1.0f, gen).contiguous();
  const int64_t N = clean.size(0), D = clean.numel() / N;
  Tensor x = clean.contiguous().clone();
  const float* pd = direction.data();
  float* px = x.data();
  for (int64_t n = 0; n < N; ++n) {
    double norm2 = 0;
    for (int64_t i = n * D; i < (n + 1) * D; ++i) norm2 += double(pd[i]) * pd[i];
    const float scale = norm2 > 0 ? float(eps / std::sqrt(norm2)) : 0.0f;
    for (int64_t i = n * D; i < (n + 1) * D; ++i) px[i] += scale * pd[i];
  }
  return x;
}

struct NormRule {
  const char* name;
  const char* help;
  const char* step_rule;  // analysis/common/input_search.h
  void (*project)(Tensor& x, const Tensor& clean, float eps);
  Tensor (*random_start)(const Tensor& clean, float eps, Generator& gen);
};

const NormRule kNorms[] = {
    {"linf", "‖δ‖∞ ≤ ε: sign steps, δ clipped per pixel", "sign", project_box, start_in_box},
    {"l2", "‖δ‖₂ ≤ ε per example: normalised L2 steps, δ scaled back onto the ball", "l2", project_ball,
     start_on_sphere},
};

const NormRule& norm_rule(const std::string& name) {
  for (const NormRule& r : kNorms)
    if (name == r.name) return r;
  std::string names;
  for (const NormRule& r : kNorms) names += cat(names.empty() ? "" : ", ", r.name);
  throw UsageError(cat("--pgd-norm: unknown norm '", name, "'; norms: ", names));
}

// The key of PGD's random starts, apart from the seed's other streams.
constexpr uint64_t kStartStream = 0x5067645f61747461ull;

// Each example's random start from a generator of its own, keyed by (seed, draw, key).
Tensor keyed_random_start(const NormRule& norm, const Tensor& clean, float eps, uint64_t seed, int64_t draw,
                          const std::vector<int64_t>& keys) {
  const int64_t N = clean.size(0), D = clean.numel() / N;
  check(int64_t(keys.size()) == N, "PGD: ", keys.size(), " random-start keys for ", N, " examples");
  Tensor x = Tensor::empty(clean.shape());
  for (int64_t n = 0; n < N; ++n) {
    Generator gen = example_generator(seed ^ kStartStream, draw, keys[size_t(n)]);
    const Tensor row = norm.random_start(slice(clean, 0, n, n + 1).contiguous(), eps, gen).contiguous();
    std::copy(row.data(), row.data() + D, x.data() + n * D);
  }
  return x;
}

// Where PGD starts when options.random_start: a random point of the ε-set around `clean`.
using RandomStart = std::function<Tensor(const NormRule& norm, const Tensor& clean)>;

Tensor attack(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels, const PgdOptions& o,
              const RandomStart& random_start) {
  check_pgd_options(o);
  check(raw.defined() && raw.dim() >= 2 && raw.size(0) == int64_t(labels.size()), "PGD: ",
        raw.defined() ? raw.shape() : Shape{}, " inputs for ", labels.size(), " labels");
  const Tensor clean = raw.contiguous();
  if (o.eps == 0.0f) return clean;
  const NormRule& norm = norm_rule(o.norm);
  InputSearchOptions search;
  search.rule = norm.step_rule;
  search.steps = o.steps;
  search.step = pgd_step_size(o);
  search.range = {0.0f, 1.0f};
  search.clamp = true;
  search.keep_best = false;  // the last iterate, as in Madry et al.
  search.project = [&](Tensor& x) { norm.project(x, clean, o.eps); };
  const Tensor start = o.random_start ? random_start(norm, clean) : clean;
  // Ascending the cross-entropy is descending its negation.
  return minimise_per_example([&](const Tensor& x) { return -per_example_cross_entropy(logits(x), labels); }, start,
                              search)
      .best;
}

// Random starts drawn in turn from one generator over the batch (pgd_attack, robust_accuracy).
RandomStart drawn_from(Generator& gen, float eps) {
  return [&gen, eps](const NormRule& norm, const Tensor& clean) { return norm.random_start(clean, eps, gen); };
}

// Sets a model's mode for the life of the guard and restores the previous one after.
class ModeGuard {
public:
  ModeGuard(Model& model, bool training) : model_(model), was_training_(model.training()) { model.train(training); }
  ~ModeGuard() { model_.train(was_training_); }

private:
  Model& model_;
  bool was_training_;
};

}  // namespace

std::vector<std::string> pgd_norm_names() {
  std::vector<std::string> names;
  for (const NormRule& r : kNorms) names.push_back(r.name);
  return names;
}

void check_pgd_options(const PgdOptions& o) {
  norm_rule(o.norm);
  if (!(std::isfinite(o.eps) && o.eps >= 0))
    throw UsageError(cat("option --pgd-eps must be a finite number at least 0, got ", o.eps));
  if (o.steps < 1) throw UsageError(cat("option --pgd-steps must be at least 1 (0 steps would report clean accuracy as robust), got ", o.steps));
  if (!std::isfinite(o.step_size) || o.step_size < 0)
    throw UsageError(cat("option --pgd-step-size must be a finite number at least 0 (0: 2.5·ε/steps), got ",
                         o.step_size));
}

float pgd_step_size(const PgdOptions& o) {
  return o.step_size > 0 ? o.step_size : 2.5f * o.eps / float(std::max<int64_t>(o.steps, 1));
}

Tensor per_example_cross_entropy(const Tensor& logits, const std::vector<int64_t>& labels) {
  check(logits.dim() == 2 && logits.size(0) == int64_t(labels.size()), "cross-entropy: logits ", logits.shape(),
        " for ", labels.size(), " labels; expected (N, classes)");
  const int64_t C = logits.size(1);
  Tensor one_hot = Tensor::zeros(logits.shape());
  for (size_t n = 0; n < labels.size(); ++n) {
    check(labels[n] >= 0 && labels[n] < C, "cross-entropy: label ", labels[n], " of example ", n, " is outside [0, ",
          C, ")");
    one_hot.data()[int64_t(n) * C + labels[n]] = 1.0f;
  }
  return -sum(log_softmax(logits, 1) * one_hot, {1});
}

Tensor pgd_attack(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels,
                  const PgdOptions& o) {
  Generator gen(o.seed);
  return attack(logits, raw, labels, o, drawn_from(gen, o.eps));
}

Tensor pgd_attack_keyed(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels,
                        const PgdOptions& o, int64_t draw, const std::vector<int64_t>& keys) {
  return attack(logits, raw, labels, o, [&](const NormRule& norm, const Tensor& clean) {
    return keyed_random_start(norm, clean, o.eps, o.seed, draw, keys);
  });
}

Tensor normalise_pixels(const Tensor& raw, const std::vector<float>& mean, const std::vector<float>& std,
                        const std::string& who) {
  if (mean.empty() && std.empty()) return raw;
  check(raw.dim() == 4, who, " normalises images (N, C, H, W), got ", raw.shape());
  const int64_t C = raw.size(1);
  std::vector<float> shift(static_cast<size_t>(C)), scale(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    shift[size_t(c)] = mean.empty() ? 0.0f : mean[size_t(c) % mean.size()];
    scale[size_t(c)] = std.empty() ? 1.0f : 1.0f / std[size_t(c) % std.size()];
  }
  const Tensor m = broadcast_to(Tensor::from_vector({1, C, 1, 1}, shift), raw.shape());
  const Tensor s = broadcast_to(Tensor::from_vector({1, C, 1, 1}, scale), raw.shape());
  return (raw - m) * s;
}

Tensor raw_pixels(const Tensor& normalised, const std::vector<float>& mean, const std::vector<float>& std,
                  const std::string& who) {
  if (mean.empty() && std.empty()) return normalised.contiguous();
  check(normalised.dim() == 4, who, " normalises images (N, C, H, W), got ", normalised.shape());
  const Tensor x = normalised.contiguous();
  const int64_t C = x.size(1), plane = x.size(2) * x.size(3);
  Tensor raw = Tensor::empty(x.shape());
  const float* px = x.data();
  float* pr = raw.data();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t c = size_t((i / plane) % C);
    const float shift = mean.empty() ? 0.0f : mean[c % mean.size()];
    const float scale = std.empty() ? 1.0f : std[c % std.size()];
    pr[i] = px[i] * scale + shift;
  }
  return raw;
}

TrainingStep adversarial_training_step(const TrainOptions& options, const PgdOptions& pgd,
                                       const std::vector<float>& mean, const std::vector<float>& std) {
  check_pgd_options(pgd);
  const TrainingStep classify = classification_step(options);
  const Sharding sharding = sharding_of(options);
  TrainingStep t;
  t.name = "pgd";
  t.metadata = {{"train.adversarial", "pgd"},
                {"train.pgd-norm", pgd.norm},
                {"train.pgd-eps", cat(pgd.eps)},
                {"train.pgd-steps", cat(pgd.steps)},
                {"train.pgd-step-size", cat(pgd_step_size(pgd))},
                {"train.pgd-random-start", pgd.random_start ? "yes" : "no"},
                {"train.shards", classify.metadata.at("train.shards")}};
  // Checkpoints of the whole-batch attack (random starts drawn per batch) lack train.shards.
  t.required_on_resume = {"train.shards"};
  t.reads_own_shards_only = true;  // the attack reads this rank's shards, as the classification step does
  t.run = [=](Model& model, const Batch& batch, int64_t step) {
    check(batch.inputs.dim() == 4 && batch.size() > 0 && int64_t(batch.labels.size()) == batch.size(),
          "--adversarial pgd: expects an image classifier's batches (N, C, H, W) with one label each, got ",
          batch.inputs.shape(), " with ", batch.labels.size(), " labels");
    const std::string who = "PGD: the model being trained";
    const auto input = [&](const Tensor& raw) { return normalise_pixels(raw, mean, std, who); };
    const RawClassifier logits = [&](const Tensor& raw) { return model.forward(input(raw)); };
    // The rows of other ranks' shards stay zeros, as the loader left them: never read.
    Batch attacked = batch;
    attacked.inputs = Tensor::zeros(batch.inputs.shape());
    const int64_t per_example = batch.inputs.numel() / batch.size();
    {
      ModeGuard eval(model, false);
      const ShardBlock mine = local_shards(sharding);
      for (int64_t s = mine.first; s < mine.first + mine.count; ++s) {
        const auto [begin, end] = shard_rows(batch.size(), s, sharding.shards);
        if (begin == end) continue;  // fewer rows than shards: the classification step refuses the batch
        const std::vector<int64_t> labels(batch.labels.begin() + begin, batch.labels.begin() + end);
        const std::vector<int64_t> samples(batch.indices.begin() + begin, batch.indices.begin() + end);
        const Tensor clean = raw_pixels(slice(batch.inputs, 0, begin, end).contiguous(), mean, std, who);
        // Each shard attacked on its own, each example from a start keyed by the step and its
        // dataset index: the same rows at any rank count, and after a resume.
        const Tensor adversarial = pgd_attack_keyed(logits, clean, labels, pgd, step, samples);
        NoGrad off;
        const Tensor rows = input(adversarial).contiguous();
        std::copy(rows.data(), rows.data() + rows.numel(), attacked.inputs.data() + begin * per_example);
      }
    }
    return classify.run(model, attacked, step);
  };
  return t;
}

double accuracy(const std::function<Tensor(const Tensor&)>& logits, const Tensor& raw,
                const std::vector<int64_t>& labels, int64_t batch) {
  const int64_t N = raw.defined() ? raw.size(0) : 0;
  check(N > 0 && int64_t(labels.size()) == N, "accuracy: ", N, " images and ", labels.size(), " labels");
  NoGrad off;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < N; begin += batch) {
    const int64_t end = std::min(N, begin + batch);
    const Tensor out = logits(slice(raw, 0, begin, end).contiguous()).contiguous();
    const int64_t C = out.size(1);
    for (int64_t n = 0; n < end - begin; ++n) {
      const float* row = out.data() + n * C;
      correct += (std::max_element(row, row + C) - row) == labels[size_t(begin + n)];
    }
  }
  return double(correct) / double(N);
}

std::vector<double> robust_accuracy(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels,
                                    const std::vector<float>& grid, const PgdOptions& attack_options, int64_t batch) {
  const int64_t N = raw.defined() ? raw.size(0) : 0;
  check(N > 0 && int64_t(labels.size()) == N, "robust accuracy: ", N, " images and ", labels.size(), " labels");
  check(batch > 0, "robust accuracy: the batch must be positive, got ", batch);
  std::vector<double> out;
  for (float eps : grid) {
    PgdOptions o = attack_options;
    o.eps = eps;
    Generator gen(o.seed);  // one stream over the batches of this ε
    Tensor attacked = Tensor::empty(raw.shape());
    const int64_t per = raw.numel() / N;
    for (int64_t begin = 0; begin < N; begin += batch) {
      const int64_t end = std::min(N, begin + batch);
      const std::vector<int64_t> part(labels.begin() + begin, labels.begin() + end);
      const Tensor a = attack(logits, slice(raw, 0, begin, end).contiguous(), part, o, drawn_from(gen, o.eps));
      std::copy(a.data(), a.data() + a.numel(), attacked.data() + begin * per);
    }
    out.push_back(accuracy(logits, attacked, labels, batch));
  }
  return out;
}

double area_under_accuracy(const std::vector<float>& grid, const std::vector<double>& accuracy) {
  check(grid.size() >= 2 && grid.size() == accuracy.size(), "AuA: ", grid.size(), " ε values and ", accuracy.size(),
        " accuracies; expected at least two of each, as many");
  double area = 0;
  for (size_t k = 0; k + 1 < grid.size(); ++k)
    area += (double(grid[k + 1]) - double(grid[k])) * (accuracy[k] + accuracy[k + 1]) / 2.0;
  return area;
}

void check_eps_grid(const std::vector<float>& grid, const std::string& option) {
  bool ok = grid.size() >= 2;
  for (size_t k = 0; ok && k < grid.size(); ++k)
    ok = std::isfinite(grid[k]) && grid[k] >= 0 && (k == 0 || grid[k] > grid[k - 1]);
  if (!ok) {
    std::string text;
    for (float v : grid) text += cat(text.empty() ? "" : ",", v);
    throw UsageError(cat("option --", option, " expects at least two increasing ε values, none negative (e.g. "
                         "0,0.025,0.05,0.1), got '", text, "'"));
  }
}

}  // namespace adjoint
