#include "analysis/similarity/model_similarity.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "analysis/similarity/representation_similarity.h"
#include "analysis/similarity/second_moment.h"
#include "analysis/similarity/tensor_similarity.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/matrix64.h"

namespace adjoint {

namespace {

// One bilinear layer (residual or not: the closed form takes a residual block's identity
// path as one more unit).
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

const OutputExpansion& MomentCache::expansion(const Model& model, const PolynomialView& view) {
  const auto key = std::make_pair(&model, view.positions);
  auto it = expansions_.find(key);
  if (it == expansions_.end()) it = expansions_.emplace(key, expand_output(view)).first;
  return it->second;
}

const std::vector<double>& MomentCache::exact_self(const Model& model, const PolynomialView& view, double input_std) {
  const auto key = std::make_tuple(&model, view.positions, input_std);
  auto it = self_.find(key);
  if (it == self_.end()) {
    const OutputExpansion& e = expansion(model, view);
    it = self_.emplace(key, exact_output_inner(e, e, input_std)).first;
  }
  return it->second;
}

const HermiteExpansion& MomentCache::hermite(const Model& model, const PolynomialView& view, double input_std) {
  const Key key{&model, view.positions, input_std};
  auto it = hermite_.find(key);
  if (it == hermite_.end()) it = hermite_.emplace(key, hermite_expansion(view, input_std)).first;
  return it->second;
}

const std::vector<double>& MomentCache::hermite_self(const Model& model, const PolynomialView& view, double input_std) {
  const Key key{&model, view.positions, input_std};
  auto it = hermite_self_.find(key);
  if (it == hermite_self_.end()) {
    const HermiteExpansion& e = hermite(model, view, input_std);
    it = hermite_self_.emplace(key, hermite_output_inner(e, e)).first;
  }
  return it->second;
}

const std::vector<double>& MomentCache::attention_block_self(const Model& model, const PolynomialView& view,
                                                            double input_std,
                                                            const std::function<void(int64_t, int64_t)>& progress) {
  const Key key{&model, view.positions, input_std};
  auto it = attention_block_self_.find(key);
  if (it == attention_block_self_.end())
    it = attention_block_self_.emplace(key, attention_block_class_inner(view, view, input_std, progress)).first;
  return it->second;
}

namespace {

// Whether writing the view out as polynomials fits the budget, and why not.
bool polynomial_tractable(const PolynomialView& v, int64_t features, std::string* why) {
  const PolynomialCost c = polynomial_cost(v, features);
  if (c.multiply_adds <= kPolynomialMultiplyAddBudget && c.held <= kPolynomialCoefficientBudget) return true;
  // Two networks of one architecture give the same reason: said once.
  const std::string reason =
      cat("; written out as polynomials (", c.variables, " input variables", features ? " in the embeddings' span" : "",
          ", degree ", c.degree, "), ", v.arch, " would take ", c.multiply_adds, " multiply-adds and hold ", c.held,
          " coefficients (budget ", kPolynomialMultiplyAddBudget, ", ", kPolynomialCoefficientBudget, ")");
  if (why->find(reason) == std::string::npos) *why += reason;
  return false;
}

// u − v, elementwise.
std::vector<double> minus(std::vector<double> u, const std::vector<double>& v) {
  for (size_t i = 0; i < u.size(); ++i) u[i] -= v[i];
  return u;
}

// A form's x columns scaled by s: the layer read on inputs x = s·x₀.
BilinearForm on_scaled_inputs(BilinearForm f, double s) {
  for (Matrix64* m : {&f.left, &f.right})
    for (int64_t r = 0; r < m->rows; ++r)
      for (int64_t c = 1; c < m->cols; ++c) (*m)(r, c) *= s;
  return f;
}

}  // namespace

std::optional<PreparedLayer> prepared_layer(const Model& m, const TensorSimOptions& o, const Model* reference) {
  const PolynomialView view = m.polynomial_view(o.positions);
  if (!single_bilinear_layer(view)) return std::nullopt;
  const SimilarityMetric& metric = similarity_metric(o.metric);
  if (o.input_std != 1.0 && std::string(metric.name) != "gaussian")
    throw UsageError(cat("tensor similarity: --input-std sets the Gaussian metric's input; the ", metric.name,
                         " metric has none"));
  BilinearForm form = bilinear_form(view);
  if (reference) form = difference(form, bilinear_form(reference->polynomial_view(o.positions)));
  return prepare_layer(metric, on_scaled_inputs(form, o.input_std), o.bias, o.data);
}

TensorSimScore closed_form_score(const PreparedLayer& a, const PreparedLayer& b, const TensorSimOptions& o) {
  const Similarity s = tensor_similarity(a, b);
  TensorSimScore score;
  score.kind = "exact";
  score.method = cat("closed form, ", a.metric->name, " metric", o.bias ? "" : ", no bias");
  score.total = s.total, score.slices = s.slices;
  score.inner_ab = s.inner_ab, score.inner_aa = s.inner_aa, score.inner_bb = s.inner_bb;
  score.slice_ab = s.slice_ab, score.slice_aa = s.slice_aa, score.slice_bb = s.slice_bb;
  return score;
}

TensorSimScore tensor_similarity(const Model& a, const Model& b, const TensorSimOptions& o, const Model* reference,
                                 MomentCache* cache) {
  const PolynomialView va = a.polynomial_view(o.positions), vb = b.polynomial_view(o.positions);
  TensorSimScore score;
  if (single_bilinear_layer(va) && single_bilinear_layer(vb))
    return closed_form_score(*prepared_layer(a, o, reference), *prepared_layer(b, o), o);
  if (o.metric != "gaussian" || !o.bias)
    throw UsageError(cat("tensor similarity: ", a.config().arch,
                         " has more than one bilinear layer; deep networks are compared under the Gaussian metric "
                         "with the bias coordinate (drop --metric and --no-bias)"));
  if (!(o.input_std > 0 && std::isfinite(o.input_std)))
    throw UsageError(cat("tensor similarity: --input-std must be a positive number, got ", o.input_std));
  MomentCache own;
  MomentCache& cache_ = cache ? *cache : own;
  std::string why;
  if (o.recursion)
    why = "asked for (--recursion)";
  else if (!expandable(va, &why) || !expandable(vb, &why) ||
           (reference && !expandable(reference->polynomial_view(o.positions), &why)))
    why = cat("the Isserlis sum does not apply: ", why);
  else {
    const OutputExpansion &ea = cache_.expansion(a, va), &eb = cache_.expansion(b, vb);
    const OutputExpansion diff = reference ? expansion_difference(ea, expand_output(reference->polynomial_view(o.positions)))
                                           : OutputExpansion{};
    const OutputExpansion& left = reference ? diff : ea;
    const int64_t cost = exact_contractions(left, eb) + exact_contractions(left, left);
    if (cost <= kExactContractionBudget) {
      const DeepSimilarity exact = similarity_from_inner(
          exact_output_inner(left, eb, o.input_std),
          reference ? exact_output_inner(left, left, o.input_std) : cache_.exact_self(a, va, o.input_std),
          cache_.exact_self(b, vb, o.input_std), eb.classes);
      score.kind = "exact";
      score.method = cat("exact Isserlis sum over ", exact_contractions(left, eb), " matchings (gaussian)");
      score.total = exact.similarity;
      score.inner_ab = exact.inner_ab, score.inner_aa = exact.inner_aa, score.inner_bb = exact.inner_bb;
      score.slices = exact.slices;
      return score;
    }
    why = cat("the Isserlis sum would take ", cost, " contractions (budget ", kExactContractionBudget, ")");
  }
  if (!o.recursion) {
    const PolynomialView vr = reference ? reference->polynomial_view(o.positions) : PolynomialView{};
    std::vector<const PolynomialView*> views = {&va, &vb};
    if (reference) views.push_back(&vr);
    // Each network over its own input (its expansion cached across pairs), else the pair over
    // the span of their embeddings (shared_input_basis), where that is smaller.
    std::string plain_why, reduced_why;
    bool plain = true, reduced = false;
    for (const PolynomialView* v : views) plain = polynomial_tractable(*v, 0, &plain_why) && plain;
    const Matrix64 basis = plain ? Matrix64() : shared_input_basis(views);
    if (basis.cols > 0) {
      reduced = true;
      for (const PolynomialView* v : views) reduced = polynomial_tractable(*v, basis.cols, &reduced_why) && reduced;
    }
    if (plain || reduced) {
      std::deque<HermiteExpansion> own;  // the pair's, when read through its basis
      auto expansion = [&](const Model& m, const PolynomialView& v) -> const HermiteExpansion& {
        return plain ? cache_.hermite(m, v, o.input_std) : own.emplace_back(hermite_expansion(v, o.input_std, &basis));
      };
      const HermiteExpansion &ha = expansion(a, va), &hb = expansion(b, vb);
      std::vector<double> ab = hermite_output_inner(ha, hb);
      std::vector<double> aa = plain ? cache_.hermite_self(a, va, o.input_std) : hermite_output_inner(ha, ha);
      const std::vector<double> bb = plain ? cache_.hermite_self(b, vb, o.input_std) : hermite_output_inner(hb, hb);
      if (reference) {  // (a − r)·b = a·b − r·b and (a − r)² = a² − 2·a·r + r²
        const HermiteExpansion hr = hermite_expansion(vr, o.input_std, plain ? nullptr : &basis);
        const std::vector<double> ar = hermite_output_inner(ha, hr), rr = hermite_output_inner(hr, hr);
        ab = minus(ab, hermite_output_inner(hr, hb));
        for (size_t k = 0; k < aa.size(); ++k) aa[k] += rr[k] - 2 * ar[k];
      }
      const DeepSimilarity exact = similarity_from_inner(ab, aa, bb, hb.classes);
      score.kind = "exact";
      score.method = cat("exact sum over the networks written out as polynomials (", ha.variables, " input variables",
                         plain ? "" : ", the span of their embeddings", "; Hermite basis, gaussian)");
      score.total = exact.similarity;
      score.inner_ab = exact.inner_ab, score.inner_aa = exact.inner_aa, score.inner_bb = exact.inner_bb;
      score.slices = exact.slices;
      return score;
    }
    why += plain_why + reduced_why;
    // One attention block: written out one position's input at a time, each network in its
    // own embedding's variables (canonical_pairing.h), so its own terms are cached across pairs.
    bool blocks = true;
    for (const PolynomialView* v : views) blocks = blocks && single_attention_block(*v);
    if (blocks) {
      AttentionBlockCost cost = attention_block_cost(va, vb);
      if (reference) cost.multiply_adds *= 4;  // a·b, r·b, a·r and r·r
      if (cost.multiply_adds <= kAttentionBlockMultiplyAddBudget && cost.held <= kAttentionBlockCoefficientBudget) {
        auto reporter = [&](const char* what) -> std::function<void(int64_t, int64_t)> {
          if (!o.progress) return {};
          return [&o, what](int64_t done, int64_t total) { o.progress(what, double(done) / double(total)); };
        };
        auto inner = [&](const PolynomialView& x, const PolynomialView& y, const char* what) {
          return attention_block_class_inner(x, y, o.input_std, reporter(what));
        };
        std::vector<double> ab = inner(va, vb, "<A|B>");
        std::vector<double> aa = cache_.attention_block_self(a, va, o.input_std, reporter("<A|A>"));
        const std::vector<double> bb = cache_.attention_block_self(b, vb, o.input_std, reporter("<B|B>"));
        if (reference) {  // as above
          const std::vector<double> ar = inner(va, vr, "<A|R>"), rr = inner(vr, vr, "<R|R>");
          ab = minus(ab, inner(vr, vb, "<R|B>"));
          for (size_t k = 0; k < aa.size(); ++k) aa[k] += rr[k] - 2 * ar[k];
        }
        const DeepSimilarity exact = similarity_from_inner(ab, aa, bb, vb.steps.back().weight.size(0));
        score.kind = "exact";
        score.method = cat("exact sum over one position's input at a time (one attention block; ", va.positions,
                           " positions, each network in ", cost.variables,
                           " variables of its embedding, paired by canonical correlation; Hermite basis, gaussian; ",
                           cost.multiply_adds, " multiply-adds)");
        score.total = exact.similarity;
        score.inner_ab = exact.inner_ab, score.inner_aa = exact.inner_aa, score.inner_bb = exact.inner_bb;
        score.slices = exact.slices;
        return score;
      }
      why += cat("; one position at a time, the attention block would take ", cost.multiply_adds, " multiply-adds and hold ",
                 cost.held, " coefficients (budget ", kAttentionBlockMultiplyAddBudget, ", ", kAttentionBlockCoefficientBudget,
                 "; fewer positions cost less: --positions)");
    }
  }
  if (reference) throw UsageError(cat("tensor similarity: --diff of deep networks needs the exact sum; ", why));
  const DeepSimilarity deep =
      deep_similarity(va, vb, cache_.of(a, va, o.input_std), cache_.of(b, vb, o.input_std));
  score.kind = "recursion-approx";
  score.method = cat("second-moment recursion (gaussian), an approximation beyond the first bilinear layer: ", why);
  score.total = deep.similarity;
  score.inner_ab = deep.inner_ab, score.inner_aa = deep.inner_aa, score.inner_bb = deep.inner_bb;
  score.slices = deep.slices;
  return score;
}

MonteCarloSimilarity monte_carlo_check(const Model& a, const Model& b, const TensorSimOptions& o, int64_t samples,
                                       const Model* reference, uint64_t seed) {
  if (o.metric != "gaussian" || !o.bias)
    throw UsageError("--check-mc samples the Gaussian metric with the bias coordinate (drop --metric identity and --no-bias)");
  if (samples < 2) throw UsageError(cat("--check-mc needs at least 2 samples, got ", samples));
  const PolynomialView ref = reference ? reference->polynomial_view(o.positions) : PolynomialView{};
  return monte_carlo_estimate(a.polynomial_view(o.positions), b.polynomial_view(o.positions), samples, seed, o.input_std,
                              reference ? &ref : nullptr);
}

namespace {

// The baselines: each reads the two models' activations on the same inputs, or their weights.
struct Baseline {
  const char* name;
  const char* summary;
  double (*score)(const Activations& a, const Activations& b, const Model& ma, const Model& mb);
  // Why the baseline does not apply to this pair (empty: it does); null: it always does.
  std::string (*not_applicable)(const Model& ma, const Model& mb) = nullptr;
};

std::string parameter_shapes_differ(const Model& ma, const Model& mb) {
  const NamedTensors pa = ma.named_parameters(), pb = mb.named_parameters();
  bool same = pa.size() == pb.size();
  for (size_t i = 0; same && i < pa.size(); ++i)
    same = pa[i].first == pb[i].first && pa[i].second.shape() == pb[i].second.shape();
  return same ? "" : "the models' parameters differ in names or shapes";
}

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
     [](const Activations&, const Activations&, const Model& ma, const Model& mb) { return weight_cosine(ma, mb); },
     parameter_shapes_differ},
};

}  // namespace

std::vector<BaselineScore> baseline_scores(const Model& a, const Model& b, const Tensor& inputs,
                                           const std::vector<std::string>& only) {
  const Activations xa = activations(a, inputs), xb = activations(b, inputs);
  std::vector<BaselineScore> out;
  for (const Baseline& base : kBaselines)
    if (only.empty() || std::find(only.begin(), only.end(), base.name) != only.end()) {
      if (const std::string why = base.not_applicable ? base.not_applicable(a, b) : ""; !why.empty())
        out.push_back({base.name, base.summary, NAN, why});
      else
        out.push_back({base.name, base.summary, base.score(xa, xb, a, b), ""});
    }
  check(only.empty() || out.size() == only.size(), "baseline_scores: an unknown baseline among those asked for");
  return out;
}

}  // namespace adjoint
