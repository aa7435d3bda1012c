#include "analysis/similarity/model_similarity.h"

#include "analysis/similarity/radial_quadrature.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "analysis/similarity/network_tensor.h"
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

namespace {

// A pair of networks as the routes see it: their polynomial views (the facts every route asks
// about), the options, the cache of each network's own terms, and what the routes tried so far
// found. A route's `applies` may leave a plan here for its `compute` (the Isserlis route its
// expansions, the polynomial route its input basis).
struct RoutePair {
  const Model& a;
  const Model& b;
  const Model* reference;
  const TensorSimOptions& o;
  MomentCache& cache;
  PolynomialView va, vb, vr;  // vr: the reference's, or empty
  std::string why;            // why the routes tried so far did not answer

  std::vector<const PolynomialView*> views() const {
    std::vector<const PolynomialView*> out = {&va, &vb};
    if (reference) out.push_back(&vr);
    return out;
  }
  // The Isserlis route's plan: both expansions (the left one A − R under --diff).
  const OutputExpansion* isserlis_b = nullptr;
  OutputExpansion isserlis_left;
  // The polynomial route's plan: each network over its own input, or the pair over the span
  // of their embeddings (`basis`).
  bool polynomial_plain = false;
  Matrix64 polynomial_basis;
  AttentionBlockCost block_cost;
};

// The score of a route that gives the three inner products per output coordinate.
TensorSimScore score_of(const std::string& kind, const std::string& method, const DeepSimilarity& s) {
  TensorSimScore score;
  score.kind = kind;
  score.method = method;
  score.total = s.similarity;
  score.inner_ab = s.inner_ab, score.inner_aa = s.inner_aa, score.inner_bb = s.inner_bb;
  score.slices = s.slices;
  return score;
}

// (A − R)·B = A·B − R·B and |A − R|² = A·A − 2·A·R + R·R, from a route's inner product.
template <class Inner>
void subtract_reference(std::vector<double>& ab, std::vector<double>& aa, Inner inner_of) {
  const std::vector<double> ar = inner_of("a", "r"), rr = inner_of("r", "r"), rb = inner_of("r", "b");
  ab = minus(ab, rb);
  for (size_t k = 0; k < aa.size(); ++k) aa[k] += rr[k] - 2 * ar[k];
}

// One bilinear layer each: the closed form (tensor_similarity.h).
bool one_layer_each(RoutePair& p) { return single_bilinear_layer(p.va) && single_bilinear_layer(p.vb); }
TensorSimScore closed_form(RoutePair& p) {
  return closed_form_score(*prepared_layer(p.a, p.o, p.reference), *prepared_layer(p.b, p.o), p.o);
}

// Whether every attention step of the pair is the plain one the exact routes take; says why not.
bool plain_attention_only(RoutePair& p, const char* route) {
  for (const PolynomialView* v : p.views())
    for (const PolynomialStep& s : v->steps)
      if (s.kind == PolynomialStep::Kind::Attention && !plain_attention(s)) {
        p.why += cat("; ", route, " does not take attention with QK biases or rotary positions ('", s.name, "')");
        return false;
      }
  return true;
}

// The identity metric of deeper networks: their whole tensors' inner product, contracted layer
// by layer (network_tensor.h), log-scaled.
bool identity_at_depth(RoutePair& p) { return p.o.metric == "identity"; }
TensorSimScore network_tensors(RoutePair& p) {
  if (!plain_attention_only(p, "the identity metric at depth")) throw UsageError(cat("tensor similarity", p.why));
  if (!p.o.bias)
    throw UsageError("tensor similarity: the identity metric of a deep network includes the constant coordinate "
                     "(its tensors are over x̃ = (1, x)); drop --no-bias");
  if (p.o.input_std != 1.0) throw UsageError("tensor similarity: --input-std sets the Gaussian metric's input; the identity metric has none");
  const NetworkTensorInner ab = network_tensor_inner(p.va, p.vb), bb = network_tensor_inner(p.vb, p.vb);
  NetworkTensorInner aa = network_tensor_inner(p.va, p.va);
  // Each inner product as values times e^scale: put those of one side on a common scale.
  auto at_scale = [](const NetworkTensorInner& x, double scale) {
    std::vector<double> v = x.value;
    for (double& e : v) e *= std::exp(x.log_scale - scale);
    return v;
  };
  double scale_a = aa.log_scale, scale_ab = ab.log_scale;
  std::vector<double> vab = ab.value, vaa = aa.value;
  if (p.reference) {  // (A − R)·B = A·B − R·B, |A − R|² = A·A − 2·A·R + R·R
    const NetworkTensorInner rb = network_tensor_inner(p.vr, p.vb), ar = network_tensor_inner(p.va, p.vr),
                             rr = network_tensor_inner(p.vr, p.vr);
    scale_a = std::max({aa.log_scale, ar.log_scale, rr.log_scale}), scale_ab = std::max(ab.log_scale, rb.log_scale);
    vab = minus(at_scale(ab, scale_ab), at_scale(rb, scale_ab));
    vaa = at_scale(aa, scale_a);
    const std::vector<double> var = at_scale(ar, scale_a), vrr = at_scale(rr, scale_a);
    for (size_t k = 0; k < vaa.size(); ++k) vaa[k] += vrr[k] - 2 * var[k];
  }
  // The cosine reads ab·e^{s_ab} / sqrt(aa·e^{s_a}·bb·e^{s_b}): ab carries the difference of scales.
  const double shift = std::exp(scale_ab - 0.5 * (scale_a + bb.log_scale));
  for (double& v : vab) v *= shift;
  DeepSimilarity s = similarity_from_inner(vab, vaa, bb.value, p.vb.output_dim());
  const double log10_aa = (scale_a + std::log(s.inner_aa)) / std::log(10.0);
  s.inner_ab *= std::exp(0.5 * (scale_a + bb.log_scale)), s.inner_aa *= std::exp(scale_a), s.inner_bb *= std::exp(bb.log_scale);
  return score_of("exact",
                  cat("identity metric: the networks' whole tensors' Frobenius inner product, each layer symmetrised "
                      "over its legs, contracted layer by layer in log scale (log10 ⟨A|A⟩ = ", log10_aa, ")"),
                  s);
}

// The deep routes below answer under the Gaussian metric with the bias coordinate only.
void check_deep_options(const RoutePair& p) {
  if (p.o.metric != "gaussian" || !p.o.bias)
    throw UsageError(cat("tensor similarity: ", p.a.config().arch,
                         " has more than one bilinear layer; deep networks are compared under the Gaussian metric "
                         "with the bias coordinate (drop --metric and --no-bias)"));
  if (!(p.o.input_std > 0 && std::isfinite(p.o.input_std)))
    throw UsageError(cat("tensor similarity: --input-std must be a positive number, got ", p.o.input_std));
}

// Linear and bilinear steps only, within kExactContractionBudget: the Isserlis sum (exact_moments.h).
bool isserlis_applies(RoutePair& p) {
  std::string why;
  for (const PolynomialView* v : p.views())
    if (!expandable(*v, &why)) {
      p.why = cat("the Isserlis sum does not apply: ", why);
      return false;
    }
  const OutputExpansion& ea = p.cache.expansion(p.a, p.va);
  p.isserlis_b = &p.cache.expansion(p.b, p.vb);
  if (p.reference) p.isserlis_left = expansion_difference(ea, expand_output(p.vr));
  const OutputExpansion& left = p.reference ? p.isserlis_left : ea;
  const int64_t cost = exact_contractions(left, *p.isserlis_b) + exact_contractions(left, left);
  if (cost <= kExactContractionBudget) return true;
  p.why = cat("the Isserlis sum would take ", cost, " contractions (budget ", kExactContractionBudget, ")");
  return false;
}
TensorSimScore isserlis(RoutePair& p) {
  const OutputExpansion& eb = *p.isserlis_b;
  const OutputExpansion& left = p.reference ? p.isserlis_left : p.cache.expansion(p.a, p.va);
  const double s = p.o.input_std;
  const DeepSimilarity exact = similarity_from_inner(
      exact_output_inner(left, eb, s), p.reference ? exact_output_inner(left, left, s) : p.cache.exact_self(p.a, p.va, s),
      p.cache.exact_self(p.b, p.vb, s), eb.classes);
  return score_of("exact", cat("exact Isserlis sum over ", exact_contractions(left, eb), " matchings (gaussian)"), exact);
}

// Each network written out over its own input (its expansion cached across pairs), else the
// pair over the span of their embeddings (shared_input_basis), where that is smaller.
bool polynomial_applies(RoutePair& p) {
  if (!plain_attention_only(p, "writing out as polynomials")) return false;
  std::string plain_why, reduced_why;
  bool plain = true, reduced = false;
  for (const PolynomialView* v : p.views()) plain = polynomial_tractable(*v, 0, &plain_why) && plain;
  p.polynomial_basis = plain ? Matrix64() : shared_input_basis(p.views());
  if (p.polynomial_basis.cols > 0) {
    reduced = true;
    for (const PolynomialView* v : p.views())
      reduced = polynomial_tractable(*v, p.polynomial_basis.cols, &reduced_why) && reduced;
  }
  p.polynomial_plain = plain;
  if (plain || reduced) return true;
  p.why += plain_why + reduced_why;
  return false;
}
TensorSimScore polynomial(RoutePair& p) {
  const bool plain = p.polynomial_plain;
  const double s = p.o.input_std;
  std::deque<HermiteExpansion> own;  // the pair's, when read through its basis
  auto expansion = [&](const Model& m, const PolynomialView& v) -> const HermiteExpansion& {
    return plain ? p.cache.hermite(m, v, s) : own.emplace_back(hermite_expansion(v, s, &p.polynomial_basis));
  };
  const HermiteExpansion &ha = expansion(p.a, p.va), &hb = expansion(p.b, p.vb);
  std::vector<double> ab = hermite_output_inner(ha, hb);
  std::vector<double> aa = plain ? p.cache.hermite_self(p.a, p.va, s) : hermite_output_inner(ha, ha);
  const std::vector<double> bb = plain ? p.cache.hermite_self(p.b, p.vb, s) : hermite_output_inner(hb, hb);
  if (p.reference) {
    const HermiteExpansion hr = hermite_expansion(p.vr, s, plain ? nullptr : &p.polynomial_basis);
    subtract_reference(ab, aa, [&](const std::string& x, const std::string& y) {
      return hermite_output_inner(x == "a" ? ha : hr, y == "b" ? hb : hr);
    });
  }
  return score_of("exact",
                  cat("exact sum over the networks written out as polynomials (", ha.variables, " input variables",
                      plain ? "" : ", the span of their embeddings", "; Hermite basis, gaussian)"),
                  similarity_from_inner(ab, aa, bb, hb.classes));
}

// One attention block each, written out one position's input at a time, each network in its
// own embedding's variables (canonical_pairing.h), so its own terms are cached across pairs.
bool attention_block_applies(RoutePair& p) {
  for (const PolynomialView* v : p.views())
    if (!single_attention_block(*v)) return false;  // a rotary or biased attention is not one such block
  p.block_cost = attention_block_cost(p.va, p.vb);
  if (p.reference) p.block_cost.multiply_adds *= 4;  // a·b, r·b, a·r and r·r
  if (p.block_cost.multiply_adds <= kAttentionBlockMultiplyAddBudget && p.block_cost.held <= kAttentionBlockCoefficientBudget)
    return true;
  p.why += cat("; one position at a time, the attention block would take ", p.block_cost.multiply_adds,
               " multiply-adds and hold ", p.block_cost.held, " coefficients (budget ", kAttentionBlockMultiplyAddBudget, ", ",
               kAttentionBlockCoefficientBudget, "; fewer positions cost less: --positions)");
  return false;
}
TensorSimScore attention_block(RoutePair& p) {
  const TensorSimOptions& o = p.o;
  auto reporter = [&](const std::string& what) -> std::function<void(int64_t, int64_t)> {
    if (!o.progress) return {};
    return [&o, what](int64_t done, int64_t total) { o.progress(what, double(done) / double(total)); };
  };
  std::vector<double> ab = attention_block_class_inner(p.va, p.vb, o.input_std, reporter("<A|B>"));
  std::vector<double> aa = p.cache.attention_block_self(p.a, p.va, o.input_std, reporter("<A|A>"));
  const std::vector<double> bb = p.cache.attention_block_self(p.b, p.vb, o.input_std, reporter("<B|B>"));
  if (p.reference)
    subtract_reference(ab, aa, [&](const std::string& x, const std::string& y) {
      const std::string what = cat("<", x == "a" ? "A" : "R", "|", y == "b" ? "B" : "R", ">");
      return attention_block_class_inner(x == "a" ? p.va : p.vr, y == "b" ? p.vb : p.vr, o.input_std, reporter(what));
    });
  return score_of("exact",
                  cat("exact sum over one position's input at a time (one attention block; ", p.va.positions,
                      " positions, each network in ", p.block_cost.variables,
                      " variables of its embedding, paired by canonical correlation; Hermite basis, gaussian; ",
                      p.block_cost.multiply_adds, " multiply-adds)"),
                  similarity_from_inner(ab, aa, bb, p.vb.steps.back().weight.size(0)));
}

// Where no exact route applies: an unbiased estimate of each inner product by Monte Carlo,
// with the direct paths as a control variate, sized to the requested standard error of the
// cosine (monte_carlo.h).
bool monte_carlo_applies(RoutePair& p) {
  if (!(p.o.tolerance > 0 && std::isfinite(p.o.tolerance)))
    throw UsageError(cat("tensor similarity: --tolerance must be a positive number, got ", p.o.tolerance));
  return true;
}
// How a tempered estimate was made, and its interval or why it has none.
std::string tempered_method(const MonteCarloSimilarity& mc) {
  return cat(mc.replicates, " independent runs of tempering over directions (", mc.particles, " particles each through ", mc.rungs,
             " tempered laws, each direction along the ", mc.radial_points, "-point radial rule; the estimate where importance ",
             "sampling stayed marked), the standard error from the runs' spread",
             mc.reliable ? cat(", 95% interval ", mc.similarity - 1.96 * mc.similarity_se, " to ", mc.similarity + 1.96 * mc.similarity_se)
                         : cat(", NO reliable interval: the runs' log normalisers spread by ", mc.log_normaliser_spread,
                               " (they disagree on the mass they found, and a mean of a few of them may miss most of it)"));
}

TensorSimScore monte_carlo(RoutePair& p) {
  MonteCarloPlan plan;
  plan.tolerance = p.o.tolerance, plan.seed = p.o.seed, plan.input_std = p.o.input_std, plan.tempering = p.o.tempering;
  if (p.o.progress) {
    plan.progress = [&p](int64_t done, int64_t needed, double) { p.o.progress("Monte Carlo", double(done) / double(needed)); };
    plan.stage_progress = [&p](const std::string& stage, double share) { p.o.progress(stage, share); };
  }
  const MonteCarloSimilarity mc = monte_carlo_sized(p.va, p.vb, plan, p.reference ? &p.vr : nullptr);
  TensorSimScore score;
  score.kind = "monte-carlo";
  score.method = cat("Monte Carlo estimate (gaussian), ",
                     mc.tempered ? tempered_method(mc) : mc.radial_points ? cat(mc.samples, mc.importance ? " importance-sampled" : "", " directions, each along the ",
                                            mc.radial_points, "-point radial rule")
                                      : cat(mc.samples, " samples"),
                     mc.importance ? cat(" (a proposal at ", mc.proposal_peaks, " peaks, fitted on ", mc.proposal_draws, " more)") : "",
                     mc.proposal_declined ? cat(" (uniform directions: a proposal at ", mc.proposal_peaks, " peaks, fitted on ",
                                                mc.proposal_draws, " more, lost to them on a pilot, Pareto shape ",
                                                mc.proposal_pilot_shape, " against ", mc.uniform_pilot_shape, ")")
                                          : "",
                     mc.recheck_cleared ? cat(" (uniform directions: their first run was marked, a second of as many was not (Pareto shape ",
                                              mc.recheck_pareto_shape, "), both set aside, ", mc.recheck_draws, " more)")
                                        : "",
                     mc.control_variate ? cat(" with the direct paths as a control variate (fitted on ", mc.pilot_samples, " more)") : "",
                     mc.tempered ? "" : mc.reliable ? cat(", 95% interval ", mc.similarity - 1.96 * mc.similarity_se, " to ",
                                         mc.similarity + 1.96 * mc.similarity_se)
                                   : mc.importance && !mc.proposal_settled && mc.pareto_shape <= mc.pareto_limit
                                         ? cat(", NO reliable interval: the proposal's search for the peaks stopped before it ",
                                               "settled (peaks or heavy weights still turning up), so mass it did not find may remain")
                                         : cat(", NO reliable interval: the draws' Pareto tail shape is ", mc.pareto_shape, " (limit ",
                                               mc.pareto_limit, "; heavy tails: the standard error may understate the error)"),
                     "; no exact route: ", p.why);
  score.total = mc.similarity, score.standard_error = mc.similarity_se, score.samples = mc.samples;
  score.reliable = mc.reliable;
  score.inner_ab = mc.inner_ab, score.inner_aa = mc.inner_aa, score.inner_bb = mc.inner_bb;
  score.inner_ab_se = mc.inner_ab_se, score.inner_aa_se = mc.inner_aa_se, score.inner_bb_se = mc.inner_bb_se;
  score.slices = mc.slices, score.slice_se = mc.slice_se;
  return score;
}

// Asked for (--recursion): the second-moment recursion, an approximation beyond the first
// bilinear layer (the Gaussian closure). A difference tensor needs an exact route or sampling.
bool recursion_applies(RoutePair& p) {
  if (!p.o.recursion) return false;
  const std::string asked = p.why;  // kept for the method's label; the refusal says only why not
  p.why.clear();
  if (!plain_attention_only(p, "the recursion")) throw UsageError(cat("tensor similarity: --recursion", p.why));
  p.why = asked;
  if (p.reference) throw UsageError("tensor similarity: --diff of deep networks is not compared by the recursion; drop --recursion");
  return true;
}
TensorSimScore recursion(RoutePair& p) {
  const double s = p.o.input_std;
  return score_of("recursion-approx",
                  cat("second-moment recursion (gaussian), an approximation beyond the first bilinear layer: ", p.why),
                  deep_similarity(p.va, p.vb, p.cache.of(p.a, p.va, s), p.cache.of(p.b, p.vb, s)));
}

// The routes, tried in order: the first that applies answers. `deep`: a route for networks of
// more than one bilinear layer (the Gaussian metric with bias only); `exact`: skipped when the
// recursion is asked for; `sampled`: the only one tried when sampling is asked for.
struct Route {
  const char* name;
  bool deep, exact, sampled;
  bool (*applies)(RoutePair&);
  TensorSimScore (*compute)(RoutePair&);
};
const Route kRoutes[] = {
    {"closed form", false, true, false, one_layer_each, closed_form},
    {"network tensors", false, true, false, identity_at_depth, network_tensors},
    {"Isserlis sum", true, true, false, isserlis_applies, isserlis},
    {"explicit polynomials", true, true, false, polynomial_applies, polynomial},
    {"one position at a time", true, true, false, attention_block_applies, attention_block},
    {"second-moment recursion", true, false, false, recursion_applies, recursion},
    {"Monte Carlo", true, false, true, monte_carlo_applies, monte_carlo},
};

}  // namespace

TensorSimScore tensor_similarity(const Model& a, const Model& b, const TensorSimOptions& o, const Model* reference,
                                 MomentCache* cache) {
  MomentCache own;
  RoutePair p{a, b, reference, o, cache ? *cache : own, a.polynomial_view(o.positions), b.polynomial_view(o.positions),
              reference ? reference->polynomial_view(o.positions) : PolynomialView{}, "", nullptr, {}, false, {}, {}};
  bool deep_checked = false;
  if (o.recursion && o.sampled) throw UsageError("tensor similarity: --recursion and --sampled each choose the route; give one");
  if (o.recursion) p.why = "asked for (--recursion)";
  if (o.sampled) p.why = "sampling asked for (--sampled)";
  for (const Route& route : kRoutes) {
    if (o.sampled && !route.sampled) continue;
    if (route.deep && !deep_checked) check_deep_options(p), deep_checked = true;
    if (route.deep && route.exact && o.recursion) continue;
    if (route.applies(p)) return route.compute(p);
  }
  throw Error(cat("tensor similarity: no route compares ", a.config().arch, " with ", b.config().arch, ": ", p.why));
}

MonteCarloSimilarity monte_carlo_check(const Model& a, const Model& b, const TensorSimOptions& o, int64_t samples,
                                       const Model* reference, uint64_t seed) {
  if (o.metric != "gaussian" || !o.bias)
    throw UsageError("--check-mc samples the Gaussian metric with the bias coordinate (drop --metric identity and --no-bias)");
  if (samples < 2) throw UsageError(cat("--check-mc needs at least 2 samples, got ", samples));
  const PolynomialView ref = reference ? reference->polynomial_view(o.positions) : PolynomialView{};
  const PolynomialView va = a.polynomial_view(o.positions), vb = b.polynomial_view(o.positions);
  return monte_carlo_sized(va, vb, fixed_budget_plan(va, vb, samples, seed, o.input_std, reference ? &ref : nullptr),
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
