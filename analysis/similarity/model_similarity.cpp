#include "analysis/similarity/model_similarity.h"

#include <algorithm>

#include "analysis/similarity/representation_similarity.h"
#include "analysis/similarity/second_moment.h"
#include "analysis/similarity/tensor_similarity.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/matrix64.h"

namespace adjoint {

namespace {

bool single_bilinear_layer(const PolynomialView& v) {
  int64_t bilinear = 0;
  for (const PolynomialStep& s : v.steps) bilinear += s.kind != PolynomialStep::Kind::Linear;
  return v.positions == 1 && bilinear == 1 && v.steps.size() <= 3;
}

// Activations (..., width) as rows of a matrix: one row per example (or token).
Matrix64 as_rows(const Tensor& t) {
  const int64_t width = t.size(-1);
  Matrix64 m(t.numel() / width, width);
  const std::vector<float> v = t.contiguous().to_vector();
  for (size_t i = 0; i < v.size(); ++i) m.data[i] = v[i];
  return m;
}

struct Activations {
  Matrix64 hidden, logits;
};

Activations activations(const Model& m, const Tensor& inputs) {
  NoGrad off;
  check(m.num_blocks() >= 2, m.config().arch, " has no hidden block before its head");
  const size_t penultimate = m.num_blocks() - 2;
  const Tensor hidden = m.features(inputs, penultimate);
  return {as_rows(hidden), as_rows(m.forward_from(hidden, penultimate))};
}

}  // namespace

const MomentTrace& MomentCache::of(const Model& model, const PolynomialView& view, double input_std) {
  auto it = traces_.find({&model, input_std});
  if (it == traces_.end()) it = traces_.emplace(std::make_pair(&model, input_std), self_moments(view, input_std)).first;
  return it->second;
}

namespace {

// A form's x columns scaled by s: the layer read on inputs x = s·x₀.
BilinearForm on_scaled_inputs(BilinearForm f, double s) {
  for (Matrix64* m : {&f.left, &f.right})
    for (int64_t r = 0; r < m->rows; ++r)
      for (int64_t c = 1; c < m->cols; ++c) (*m)(r, c) *= s;
  return f;
}

}  // namespace

TensorSimScore tensor_similarity(const Model& a, const Model& b, const TensorSimOptions& o, const Model* reference,
                                 MomentCache* cache) {
  const PolynomialView va = a.polynomial_view(o.positions), vb = b.polynomial_view(o.positions);
  TensorSimScore score;
  if (single_bilinear_layer(va) && single_bilinear_layer(vb)) {
    const SimilarityMetric& metric = similarity_metric(o.metric);
    if (o.input_std != 1.0 && std::string(metric.name) != "gaussian")
      throw UsageError("tensor similarity: --input-std sets the Gaussian metric's input; the identity metric has none");
    BilinearForm fa = bilinear_form(va);
    if (reference) fa = difference(fa, bilinear_form(reference->polynomial_view(o.positions)));
    const Similarity s = tensor_similarity(metric, on_scaled_inputs(fa, o.input_std),
                                           on_scaled_inputs(bilinear_form(vb), o.input_std), o.bias);
    score.method = cat("closed form, ", metric.name, " metric", o.bias ? "" : ", no bias");
    score.total = s.total;
    score.slices = s.slices;
    return score;
  }
  if (o.metric != "gaussian" || !o.bias)
    throw UsageError(cat("tensor similarity: ", a.config().arch,
                         " has more than one bilinear layer; the second-moment recursion uses the Gaussian metric with "
                         "the bias coordinate (drop --metric and --no-bias)"));
  if (reference)
    throw UsageError("tensor similarity: --diff needs models of one bilinear layer (a difference of deep networks "
                     "is not a polynomial of the same shape)");
  MomentCache own;
  MomentCache& traces = cache ? *cache : own;
  const DeepSimilarity deep =
      deep_similarity(va, vb, traces.of(a, va, o.input_std), traces.of(b, vb, o.input_std));
  score.method = "second-moment recursion (gaussian)";
  score.total = deep.similarity;
  score.slices = deep.slices;
  return score;
}

namespace {

// The baselines: each reads the two models' activations on the same inputs, or their weights.
struct Baseline {
  const char* name;
  const char* summary;
  double (*score)(const Activations& a, const Activations& b, const Model& ma, const Model& mb);
};

const Baseline kBaselines[] = {
    {"cka_hidden", "linear CKA of the hidden features (the block before the head)",
     [](const Activations& a, const Activations& b, const Model&, const Model&) { return linear_cka(a.hidden, b.hidden); }},
    {"cka_hidden_debiased", "debiased linear CKA of the hidden features",
     [](const Activations& a, const Activations& b, const Model&, const Model&) {
       return linear_cka_debiased(a.hidden, b.hidden);
     }},
    {"cka_logits", "linear CKA of the logits",
     [](const Activations& a, const Activations& b, const Model&, const Model&) { return linear_cka(a.logits, b.logits); }},
    {"cka_logits_debiased", "debiased linear CKA of the logits",
     [](const Activations& a, const Activations& b, const Model&, const Model&) {
       return linear_cka_debiased(a.logits, b.logits);
     }},
    {"agreement", "share of inputs on which the predicted classes agree",
     [](const Activations& a, const Activations& b, const Model&, const Model&) {
       return prediction_agreement(a.logits, b.logits);
     }},
    {"output_correlation", "Pearson correlation of all logits",
     [](const Activations& a, const Activations& b, const Model&, const Model&) {
       return output_correlation(a.logits, b.logits);
     }},
    {"weight_cosine", "cosine of the flattened parameters",
     [](const Activations&, const Activations&, const Model& ma, const Model& mb) { return weight_cosine(ma, mb); }},
};

}  // namespace

std::vector<BaselineScore> baseline_scores(const Model& a, const Model& b, const Tensor& inputs,
                                           const std::vector<std::string>& only) {
  const Activations xa = activations(a, inputs), xb = activations(b, inputs);
  std::vector<BaselineScore> out;
  for (const Baseline& base : kBaselines)
    if (only.empty() || std::find(only.begin(), only.end(), base.name) != only.end())
      out.push_back({base.name, base.summary, base.score(xa, xb, a, b)});
  check(only.empty() || out.size() == only.size(), "baseline_scores: an unknown baseline among those asked for");
  return out;
}

}  // namespace adjoint
