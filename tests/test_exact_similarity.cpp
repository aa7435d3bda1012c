// The exact Gaussian inner product of deep polynomial networks (analysis/similarity/exact_moments.h)
// against a hand computation, the one-layer recursion, the expansion's own evaluation and a
// Monte Carlo estimate made here (analysis/similarity/monte_carlo.h), on independent networks;
// the explicit-polynomial routes (polynomial_moments.h, attention_block_moments.h) likewise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "analysis/similarity/attention_block_moments.h"
#include "analysis/similarity/canonical_pairing.h"
#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/polynomial_moments.h"
#include "analysis/similarity/second_moment.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/matrix64.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "models/training.h"
#include "ops/elementwise.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

Tensor matrix(int64_t rows, int64_t cols, std::vector<float> values) { return Tensor::from_vector({rows, cols}, std::move(values)); }

// One residual block h ← h + (L h̃) ⊙ (R h̃) on a scalar h, L = (l0, l1), R = (r0, r1).
PolynomialStep scalar_block(float l0, float l1, float r0, float r1) {
  PolynomialStep s;
  s.kind = PolynomialStep::Kind::Bilinear;
  s.name = "block";
  s.left = matrix(1, 2, {l0, l1}), s.right = matrix(1, 2, {r0, r1}), s.down = matrix(1, 1, {1});
  s.residual = true;
  return s;
}

ModelConfig mlp_config(int64_t depth, int64_t inputs, int64_t hidden, int64_t classes) {
  ModelConfig c;
  c.arch = "bilinear_mlp";
  c.in_features = inputs, c.hidden = hidden, c.num_classes = classes, c.depth = depth;
  return c;
}

PolynomialView random_view(const ModelConfig& c, uint64_t seed) {
  Generator g(seed);
  return make_model(c, g)->polynomial_view();
}

}  // namespace

TEST_CASE("exact moments: a scalar network by hand") {
  // h1 = x + x², h2 = h1 + h1² = x + 2x² + 2x³ + x⁴. With E[x^k] = (k−1)!! σ^k:
  // E[h2²] = 1 + 12 + 12 + 60 + 60 + 105 = 250 at σ = 1, E[h2·x] = 1 + 2·3 = 7.
  PolynomialView deep{"scalar", 1, 1, {scalar_block(0, 1, 0, 1), scalar_block(0, 1, 0, 1)}};
  PolynomialView identity{"identity", 1, 1, {}};
  const OutputExpansion f = expand_output(deep), x = expand_output(identity);
  CHECK(exact_output_inner(f, f)[0] == doctest::Approx(250).epsilon(1e-12));
  CHECK(exact_output_inner(f, x)[0] == doctest::Approx(7).epsilon(1e-12));
  // σ = 0.5: Σ c_i c_j m_{i+j} σ^{i+j} term by term.
  const double s = 0.5;
  const double want = std::pow(s, 2) + (12 + 12) * std::pow(s, 4) + (60 + 60) * std::pow(s, 6) + 105 * std::pow(s, 8);
  CHECK(exact_output_inner(f, f, s)[0] == doctest::Approx(want).epsilon(1e-12));
  // A bias in the blocks: h1 = x + (1 + x)·x = 2x + x², a constant term through the second block.
  PolynomialView biased{"biased", 1, 1, {scalar_block(1, 1, 0, 1)}};
  // E[(2x + x²)²] = 4 + 3 = 7, E[(2x + x²)·x] = 2.
  const OutputExpansion g = expand_output(biased);
  CHECK(exact_output_inner(g, g)[0] == doctest::Approx(7).epsilon(1e-12));
  CHECK(exact_output_inner(g, x)[0] == doctest::Approx(2).epsilon(1e-12));
  CHECK(telephone_number(8) == 764);
}

TEST_CASE("exact moments: the expansion evaluates to the network") {
  for (int64_t depth : {0, 1, 2}) {
    CAPTURE(depth);
    ModelConfig c = mlp_config(depth, 6, 4, 3);
    if (depth == 2) c.dim = 5;  // with an embedding
    const PolynomialView v = random_view(c, 3 + uint64_t(depth));
    const OutputExpansion e = expand_output(v);
    const std::vector<double> x = {0.3, -1.2, 0.7, 0.1, 2.0, -0.4};
    const std::vector<double> want = evaluate_polynomial(v, x, 1), got = evaluate_expansion(e, x);
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < want.size(); ++k) CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-12));
  }
}

TEST_CASE("exact moments: one residual block equals the recursion, exact there") {
  const ModelConfig c = mlp_config(1, 5, 4, 3);
  const PolynomialView a = random_view(c, 1), b = random_view(c, 2);
  for (double s : {1.0, 0.6}) {
    const DeepSimilarity exact = exact_similarity(expand_output(a), expand_output(b), s), recursion = deep_similarity(a, b, s);
    CHECK(exact.inner_ab == doctest::Approx(recursion.inner_ab).epsilon(1e-12));
    CHECK(exact.inner_aa == doctest::Approx(recursion.inner_aa).epsilon(1e-12));
    CHECK(exact.similarity == doctest::Approx(recursion.similarity).epsilon(1e-12));
    REQUIRE(exact.slices.size() == recursion.slices.size());
    for (size_t o = 0; o < exact.slices.size(); ++o) CHECK(exact.slices[o] == doctest::Approx(recursion.slices[o]).epsilon(1e-12));
  }
}

TEST_CASE("exact moments: independent depth-2 MLPs against Monte Carlo") {
  // A residual scale of 2 makes the second block's input far from Gaussian: the recursion's
  // closure is off there by many standard errors, the exact sum is not.
  ModelConfig c = mlp_config(2, 6, 4, 3);
  c.residual_scale = 2.0;
  const PolynomialView a = random_view(c, 11), b = random_view(c, 12);
  const double input_std = 1.0;
  const DeepSimilarity exact = exact_similarity(expand_output(a), expand_output(b), input_std);
  const DeepSimilarity recursion = deep_similarity(a, b, input_std);
  const MonteCarloSimilarity mc = monte_carlo_estimate(a, b, 400000, 21, input_std);
  MESSAGE("depth 2, independent: exact ", exact.similarity, ", Monte Carlo ", mc.similarity, " ± ", mc.similarity_se,
          ", recursion ", recursion.similarity);
  CHECK(std::abs(exact.similarity - mc.similarity) < 4 * mc.similarity_se);
  CHECK(std::abs(exact.inner_ab - mc.inner_ab) < 4 * mc.inner_ab_se);
  CHECK(std::abs(recursion.similarity - mc.similarity) > 8 * mc.similarity_se);  // a pair the closure gets wrong
  REQUIRE(exact.slices.size() == mc.slices.size());
  for (size_t o = 0; o < mc.slices.size(); ++o) {
    CAPTURE(o);
    CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
  }
}

TEST_CASE("exact moments: a difference of depth-2 MLPs (--diff) against Monte Carlo") {
  ModelConfig c = mlp_config(2, 5, 3, 2);
  c.dim = 4;
  Generator ga(31), gb(32), gr(33);
  const std::shared_ptr<Model> a = make_model(c, ga), b = make_model(c, gb), reference = make_model(c, gr);
  const TensorSimScore exact = tensor_similarity(*a, *b, TensorSimOptions{}, reference.get());
  CHECK(exact.kind == "exact");
  const MonteCarloSimilarity mc = monte_carlo_check(*a, *b, TensorSimOptions{}, 300000, reference.get(), 5);
  MESSAGE("(a − reference) against b: exact ", exact.total, ", Monte Carlo ", mc.similarity, " ± ", mc.similarity_se);
  CHECK(std::abs(exact.total - mc.similarity) < 4 * mc.similarity_se);
  for (size_t o = 0; o < mc.slices.size(); ++o) CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
  // Not the plain score: the reference was subtracted.
  CHECK(std::abs(exact.total - tensor_similarity(*a, *b, TensorSimOptions{}).total) > 10 * mc.similarity_se);
}

TEST_CASE("tensor similarity of deep models: exact where tractable, Monte Carlo with an interval beyond") {
  ModelConfig c = mlp_config(2, 5, 3, 2);
  Generator g1(1), g2(2);
  const std::shared_ptr<Model> a = make_model(c, g1), b = make_model(c, g2);
  const TensorSimScore exact = tensor_similarity(*a, *b, TensorSimOptions{});
  CHECK(exact.kind == "exact");
  CHECK(exact.total == doctest::Approx(exact_similarity(expand_output(a->polynomial_view()), expand_output(b->polynomial_view())).similarity).epsilon(1e-12));
  TensorSimOptions asked;
  asked.recursion = true;
  const TensorSimScore recursion = tensor_similarity(*a, *b, asked);
  CHECK(recursion.kind == "recursion-approx");
  CHECK(recursion.total == doctest::Approx(deep_similarity(a->polynomial_view(), b->polynomial_view()).similarity).epsilon(1e-12));
  // Depth 3: pieces of 8 legs, far over the Isserlis budget; five inputs written out as
  // polynomials of degree 8 instead.
  c.depth = 3;
  const std::shared_ptr<Model> deep_a = make_model(c, g1), deep_b = make_model(c, g2);
  const TensorSimScore deep = tensor_similarity(*deep_a, *deep_b, TensorSimOptions{});
  CHECK(deep.kind == "exact");
  CHECK(deep.method.find("written out as polynomials (5 input variables") != std::string::npos);
  // The bilinear LM's attention: written out as polynomials of its 2 × 5 one-hot inputs.
  ModelConfig lm;
  lm.arch = "bilinear_lm", lm.attention = "bilinear", lm.vocab = 5, lm.seq_len = 2, lm.dim = 4, lm.depth = 1, lm.heads = 2;
  lm.mlp_ratio = 1, lm.residual_scale = 0.5;
  const std::shared_ptr<Model> la = make_model(lm, g1), lb = make_model(lm, g2);
  const TensorSimScore lms = tensor_similarity(*la, *lb, TensorSimOptions{});
  CHECK(lms.kind == "exact");
  CHECK(lms.method.find("written out as polynomials (10 input variables") != std::string::npos);
  CHECK(lms.inner_ab != 0.0);
  CHECK(lms.inner_aa > 0.0);
  // A wider input (2 × 40 variables, degree 10) is over both budgets of the whole networks:
  // one position at a time, each network in its embedding's 4 directions a position.
  ModelConfig wide = lm;
  wide.vocab = 40;
  const std::shared_ptr<Model> wa = make_model(wide, g1), wb = make_model(wide, g2);
  const TensorSimScore by_position = tensor_similarity(*wa, *wb, TensorSimOptions{});
  CHECK(by_position.kind == "exact");
  CHECK(by_position.method.find("one position's input at a time (one attention block; 2 positions, each network in 4 variables of its embedding") != std::string::npos);
  // Two blocks are beyond every exact route: a Monte Carlo estimate sized to the tolerance,
  // saying why; the recursion only when asked for.
  ModelConfig deeper = wide;
  deeper.depth = 2;
  const std::shared_ptr<Model> da2 = make_model(deeper, g1), db2 = make_model(deeper, g2);
  TensorSimOptions sampled;
  sampled.tolerance = 0.02;
  sampled.input_std = 1 / std::sqrt(40.0);  // one-hot tokens' norm: at 1 the degree-25 outputs are too heavy-tailed to sample
  sampled.tempering = false;  // the route and its label are tested here; tempering a marked estimate costs a minute
  const TensorSimScore far = tensor_similarity(*da2, *db2, sampled);
  CHECK(far.kind == "monte-carlo");
  CHECK(far.standard_error > 0);
  CHECK(far.standard_error <= 0.02);
  CHECK(far.method.find("'blocks.0.attn' is a bilinear attention") != std::string::npos);
  CHECK(far.method.find("80 input variables") != std::string::npos);
  sampled.recursion = true;
  CHECK(tensor_similarity(*da2, *db2, sampled).kind == "recursion-approx");
  // --check-mc on the LM: an estimate with a standard error, one per token slice.
  const MonteCarloSimilarity mc = monte_carlo_check(*la, *lb, TensorSimOptions{}, 20000, nullptr, 3);
  CHECK(mc.similarity_se > 0);
  CHECK(mc.slices.size() == 5);
}

TEST_CASE("tensorsim --check-mc: the Monte Carlo estimate beside the exact score of a depth-2 MLP") {
  adjoint::testing::TempDir dir;
  DataSource data = open_data("modadd:5");
  ModelConfig c;
  c.arch = "bilinear_mlp", c.hidden = 4, c.depth = 2;
  fit_config_to_data(c, data);
  Generator g1(1), g2(2);
  save_checkpoint(dir.file("a.safetensors"), *make_model(c, g1), nullptr, 0, 0, {{"data.spec", "modadd:5"}});
  save_checkpoint(dir.file("b.safetensors"), *make_model(c, g2), nullptr, 0, 0, {{"data.spec", "modadd:5"}});
  const adjoint::testing::CommandOutcome o =
      adjoint::testing::run_adjoint({"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--slices",
                                     "--no-baselines", "--check-mc", "100000", "--out", dir.file("out")});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  CHECK(o.out.find("[exact: exact Isserlis sum") != std::string::npos);
  CHECK(o.out.find("Monte Carlo check, 100000 network evaluations") != std::string::npos);
  const Json j = parse_json(adjoint::testing::read_text(dir.file("out/tensorsim.json")));
  CHECK(j.find("method")->as_string() == "exact");
  const Json& mc = *j.find("monte_carlo");
  const double exact = j.find("tensor_similarity")->as_number(), estimate = mc.find("tensor_similarity")->as_number(),
               se = mc.find("standard_error")->as_number();
  CHECK(se > 0);
  CHECK(std::abs(exact - estimate) < 4 * se);
  REQUIRE(mc.find("slices")->size() == 5);
  CHECK(adjoint::testing::read_text(dir.file("out/tensorsim.csv")).find("\nmethod,exact,,,,\n") != std::string::npos);
  const adjoint::testing::CommandOutcome bad = adjoint::testing::run_adjoint(
      {"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--no-baselines", "--check-mc", "100000",
       "--metric", "identity"});
  CHECK(bad.code == 2);
}

// ---- The explicit-polynomial route (analysis/similarity/polynomial_moments.h) ----------

namespace {

ModelConfig lm_config(int64_t vocab, int64_t positions, int64_t dim, int64_t heads) {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = vocab, c.seq_len = positions, c.dim = dim, c.depth = 1;
  c.heads = heads;
  return c;
}

}  // namespace

TEST_CASE("polynomial moments: small polynomials by hand") {
  // In two standard normal variables: p = y0² + 2·y0·y1, q = y0².
  const DensePolynomial p = sum(monomial(2, {2, 0}, 1.0), monomial(2, {1, 1}, 2.0)), q = monomial(2, {2, 0}, 1.0);
  CHECK(evaluate(p, {0.5, -2.0}) == doctest::Approx(0.25 - 2.0).epsilon(1e-15));
  CHECK(evaluate(product(p, q), {0.5, -2.0}) == doctest::Approx((0.25 - 2.0) * 0.25).epsilon(1e-15));
  const DensePolynomial hp = to_hermite(p), hq = to_hermite(q);
  // E[p·q] = E[y0⁴] + 2·E[y0³]·E[y1] = 3; E[p²] = E[y0⁴] + 4·E[y0³y1] + 4·E[y0²]E[y1²] = 7.
  CHECK(hermite_inner(hp, hq) == doctest::Approx(3).epsilon(1e-14));
  CHECK(hermite_inner(hp, hp) == doctest::Approx(7).epsilon(1e-14));
  // y0² = He_2 + 1: the Hermite polynomial keeps its value.
  CHECK(hq.coefficients != q.coefficients);
  // E[(y1³·y2)²] = E[y1⁶]·E[y2²] = 15; E[y1³·y2 · y1·y2] = E[y1⁴]·E[y2²] = 3; a constant: 2·E[y1³y2] = 0.
  const DensePolynomial r = to_hermite(monomial(3, {0, 3, 1}, 1.0)), s = to_hermite(monomial(3, {0, 1, 1}, 1.0));
  CHECK(hermite_inner(r, r) == doctest::Approx(15).epsilon(1e-14));
  CHECK(hermite_inner(r, s) == doctest::Approx(3).epsilon(1e-14));
  CHECK(hermite_inner(r, to_hermite(monomial(3, {0, 0, 0}, 2.0))) == doctest::Approx(0).epsilon(1e-14));
  // The scalar network of the first test: h2 = x + 2x² + 2x³ + x⁴, E[h2²] = 250 at σ = 1.
  PolynomialView deep{"scalar", 1, 1, {scalar_block(0, 1, 0, 1), scalar_block(0, 1, 0, 1)}};
  const HermiteExpansion e = hermite_expansion(deep, 1.0), half = hermite_expansion(deep, 0.5);
  CHECK(hermite_output_inner(e, e)[0] == doctest::Approx(250).epsilon(1e-13));
  const double s2 = 0.25;
  CHECK(hermite_output_inner(half, half)[0] ==
        doctest::Approx(s2 + 24 * s2 * s2 + 120 * s2 * s2 * s2 + 105 * s2 * s2 * s2 * s2).epsilon(1e-13));
}

TEST_CASE("polynomial moments: the same numbers as the Isserlis sum on depth-1 and depth-2 MLPs") {
  for (int64_t depth : {1, 2}) {
    CAPTURE(depth);
    ModelConfig c = mlp_config(depth, 5, 4, 3);
    if (depth == 2) c.dim = 4;
    const PolynomialView a = random_view(c, 41 + uint64_t(depth)), b = random_view(c, 51 + uint64_t(depth));
    for (double s : {1.0, 0.7}) {
      const std::vector<double> isserlis = exact_output_inner(expand_output(a), expand_output(b), s);
      const std::vector<double> hermite = hermite_output_inner(hermite_expansion(a, s), hermite_expansion(b, s));
      REQUIRE(hermite.size() == isserlis.size());
      for (size_t k = 0; k < isserlis.size(); ++k) CHECK(hermite[k] == doctest::Approx(isserlis[k]).epsilon(1e-10));
    }
  }
}

namespace {

// E[f_a,k·f_b,k] per output by an exact route: here the networks written out whole.
using ExactInner = std::function<std::vector<double>(const PolynomialView&, const PolynomialView&, double input_std)>;
std::vector<double> written_out_whole(const PolynomialView& a, const PolynomialView& b, double input_std) {
  return hermite_output_inner(hermite_expansion(a, input_std), hermite_expansion(b, input_std));
}

// The exact similarity of two views by an exact route against Monte Carlo's (within 4
// standard errors: total, inner product and every slice), and, when asked, how far the
// recursion is from Monte Carlo (in standard errors).
double check_against_monte_carlo(const PolynomialView& a, const PolynomialView& b, double input_std, int64_t samples,
                                 uint64_t seed, bool recursion = false, const ExactInner& inner = written_out_whole) {
  const DeepSimilarity exact = similarity_from_inner(inner(a, b, input_std), inner(a, a, input_std),
                                                     inner(b, b, input_std), b.output_dim());
  const MonteCarloSimilarity mc = monte_carlo_estimate(a, b, samples, seed, input_std);
  const double recursion_off = recursion ? std::abs(deep_similarity(a, b, input_std).similarity - mc.similarity) / mc.similarity_se : 0;
  MESSAGE(a.arch, " (", a.positions, " × ", a.input_dim, " inputs), input std ", input_std, ": exact ", exact.similarity,
          ", Monte Carlo ", mc.similarity, " ± ", mc.similarity_se, "; the recursion is ", recursion_off, " standard errors off");
  CHECK(std::abs(exact.similarity - mc.similarity) < 4 * mc.similarity_se);
  CHECK(std::abs(exact.inner_ab - mc.inner_ab) < 4 * mc.inner_ab_se);
  REQUIRE(exact.slices.size() == mc.slices.size());
  for (size_t o = 0; o < mc.slices.size(); ++o) {
    CAPTURE(o);
    CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
  }
  return recursion_off;
}

}  // namespace

namespace {

// The nodes and weights of Gauss–Hermite quadrature for the standard normal: the roots of
// He_n (by bisection between sign changes on a fine grid) and n!/(n·He_{n−1}(root))². Exact
// for polynomials of degree ≤ 2n − 1.
std::pair<std::vector<double>, std::vector<double>> gauss_hermite(int n) {
  auto he = [](int k, double x) {  // He_k(x) by He_{j+1} = x·He_j − j·He_{j−1}
    double previous = 1, current = x;
    if (k == 0) return previous;
    for (int j = 1; j < k; ++j) {
      const double next = x * current - j * previous;
      previous = current, current = next;
    }
    return current;
  };
  std::vector<double> nodes, weights;
  const double step = 1e-3;
  for (double x = -12; x < 12; x += step) {
    if (he(n, x) * he(n, x + step) > 0) continue;
    double lo = x, hi = x + step;
    for (int it = 0; it < 100; ++it) {
      const double mid = 0.5 * (lo + hi);
      (he(n, lo) * he(n, mid) <= 0 ? hi : lo) = mid;
    }
    nodes.push_back(0.5 * (lo + hi));
  }
  double factorial = 1;
  for (int k = 2; k <= n; ++k) factorial *= k;
  for (double x : nodes) weights.push_back(factorial / std::pow(n * he(n - 1, x), 2));
  return {nodes, weights};
}

// E[f_a,k · f_b,k] per output by quadrature over every input coordinate: each network
// evaluated by its own forward arithmetic (evaluate_polynomial) on the grid of nodes.
std::vector<double> quadrature_inner(const PolynomialView& a, const PolynomialView& b, double input_std, int nodes) {
  const auto [x, w] = gauss_hermite(nodes);
  REQUIRE(int(x.size()) == nodes);
  const int64_t n = a.positions * a.input_dim;
  int64_t points = 1;
  for (int64_t v = 0; v < n; ++v) points *= nodes;
  std::vector<double> inputs, weight;
  for (int64_t p = 0; p < points; ++p) {
    double wp = 1;
    for (int64_t v = 0, rest = p; v < n; ++v, rest /= nodes) {
      inputs.push_back(input_std * x[size_t(rest % nodes)]);
      wp *= w[size_t(rest % nodes)];
    }
    weight.push_back(wp);
  }
  const std::vector<double> fa = evaluate_polynomial(a, inputs, points), fb = evaluate_polynomial(b, inputs, points);
  const size_t outputs = fa.size() / size_t(points);
  std::vector<double> inner(outputs, 0.0);
  for (int64_t p = 0; p < points; ++p)
    for (size_t k = 0; k < outputs; ++k) inner[k] += weight[size_t(p)] * fa[size_t(p) * outputs + k] * fb[size_t(p) * outputs + k];
  return inner;
}

void check_against_quadrature(const PolynomialView& a, const PolynomialView& b, double input_std, int nodes) {
  const std::vector<double> want = quadrature_inner(a, b, input_std, nodes);
  const std::vector<double> got = hermite_output_inner(hermite_expansion(a, input_std), hermite_expansion(b, input_std));
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-10));
}

}  // namespace

TEST_CASE("polynomial moments: one-block LMs and a depth-3 MLP against Gauss-Hermite quadrature") {
  // Four input variables, outputs of degree ≤ 10 in each: 11 nodes a variable integrate the
  // products (degree ≤ 20) exactly, whatever the tails, where sampling cannot.
  for (double input_std : {1.0, 0.6}) {
    CAPTURE(input_std);
    SUBCASE("bilinear LM, 2 positions × 2 tokens") {
      const ModelConfig c = lm_config(2, 2, 4, 2);
      check_against_quadrature(random_view(c, 101), random_view(c, 102), input_std, 11);
    }
    SUBCASE("bilinear LM, 4 positions × 1 token") {
      const ModelConfig c = lm_config(1, 4, 4, 2);
      check_against_quadrature(random_view(c, 105), random_view(c, 106), input_std, 11);
    }
    SUBCASE("depth-3 MLP, 3 inputs") {
      ModelConfig c = mlp_config(3, 3, 4, 2);
      c.residual_scale = 2.0;
      check_against_quadrature(random_view(c, 103), random_view(c, 104), input_std, 9);
    }
  }
}

TEST_CASE("polynomial moments: independent one-block attention LMs against Monte Carlo") {
  // Sampling a degree-20 product has heavy tails; these pairs keep its standard error honest.
  ModelConfig c = lm_config(3, 3, 4, 2);
  SUBCASE("independent") {
    const PolynomialView a = random_view(c, 61), b = random_view(c, 62);
    const PolynomialCost cost = polynomial_cost(a);
    CHECK(cost.variables == 9);
    CHECK(cost.degree == 10);
    CHECK(check_against_monte_carlo(a, b, 1.0, 200000, 71, true) > 8);  // a pair the recursion gets wrong
  }
  SUBCASE("independent blocks between a shared embedding and unembedding, residual scale 0.5") {
    c.residual_scale = 0.5;
    const PolynomialView a = random_view(c, 61);
    PolynomialView b = random_view(c, 62);
    b.steps.front() = a.steps.front(), b.steps.back() = a.steps.back();
    check_against_monte_carlo(a, b, 0.7, 200000, 72);
  }
}

TEST_CASE("polynomial moments: independent depth-3 MLPs against Monte Carlo") {
  ModelConfig c = mlp_config(3, 4, 3, 3);
  c.residual_scale = 2.0;
  const PolynomialView a = random_view(c, 81), b = random_view(c, 82);
  CHECK(polynomial_cost(a).degree == 8);
  CHECK(check_against_monte_carlo(a, b, 1.0, 200000, 83, true) > 8);
}

TEST_CASE("tensor similarity of one-block LMs: exact, --diff included, against Monte Carlo") {
  // Three tokens: the networks written out whole; twelve: one position at a time, each in its
  // embedding's variables (three embeddings of 4 would span 12 of 12 directions a position).
  const std::pair<int64_t, const char*> routes[] = {{3, "written out as polynomials"},
                                                     {12, "one position's input at a time"}};
  for (const auto& [vocab, route] : routes) {
    CAPTURE(vocab);
    ModelConfig c = lm_config(vocab, 2, 4, 2);
    TensorSimOptions options;
    options.input_std = 0.5;
    Generator ga(91), gb(92), gr(93);
    const std::shared_ptr<Model> a = make_model(c, ga), b = make_model(c, gb), reference = make_model(c, gr);
    for (const Model* r : {static_cast<const Model*>(nullptr), static_cast<const Model*>(reference.get())}) {
      CAPTURE(r != nullptr);
      const TensorSimScore exact = tensor_similarity(*a, *b, options, r);
      CHECK(exact.kind == "exact");
      CHECK(exact.method.find(route) != std::string::npos);
      const MonteCarloSimilarity mc = monte_carlo_check(*a, *b, options, 200000, r, 9);
      MESSAGE(std::string(r ? "(a − reference) against b" : "a against b"), ": exact ", exact.total, ", Monte Carlo ",
              mc.similarity, " ± ", mc.similarity_se);
      CHECK(std::abs(exact.total - mc.similarity) < 4 * mc.similarity_se);
      REQUIRE(exact.slices.size() == mc.slices.size());
      for (size_t o = 0; o < mc.slices.size(); ++o)
        CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
    }
  }
}

TEST_CASE("tensorsim: one-block LM checkpoints compared exactly, the Monte Carlo check beside") {
  adjoint::testing::TempDir dir;
  const ModelConfig c = lm_config(3, 2, 4, 2);
  Generator g1(1), g2(2);
  save_checkpoint(dir.file("a.safetensors"), *make_model(c, g1), nullptr, 0, 0, {});
  save_checkpoint(dir.file("b.safetensors"), *make_model(c, g2), nullptr, 0, 0, {});
  const adjoint::testing::CommandOutcome o =
      adjoint::testing::run_adjoint({"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--slices",
                                     "--no-baselines", "--input-std", "0.5", "--check-mc", "100000", "--out", dir.file("out")});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  CHECK(o.out.find("[exact: exact sum over the networks written out as polynomials (6 input variables") != std::string::npos);
  const Json j = parse_json(adjoint::testing::read_text(dir.file("out/tensorsim.json")));
  CHECK(j.find("method")->as_string() == "exact");
  const Json& mc = *j.find("monte_carlo");
  const double exact = j.find("tensor_similarity")->as_number(), estimate = mc.find("tensor_similarity")->as_number(),
               se = mc.find("standard_error")->as_number();
  CHECK(std::abs(exact - estimate) < 4 * se);
  CHECK(mc.find("slices")->size() == 3);
}

TEST_CASE("polynomial moments: a wide input of low degree, and one too large to hold") {
  // 120 inputs, degree 2 (C(122, 2) = 7 381 coefficients): built; a degree-24 layout of them is not.
  const PolynomialView wide = random_view(mlp_config(0, 120, 2, 2), 111);
  const HermiteExpansion e = hermite_expansion(wide, 1.0);
  CHECK(e.degree == 2);
  CHECK(e.state[0].cols == 7381);
  std::vector<int> powers(120, 0);
  powers[0] = 24;
  CHECK_THROWS_WITH_AS(monomial(120, powers, 1.0), doctest::Contains("are too many to hold"), Error);
}

TEST_CASE("polynomial moments: read through the span of the embeddings, the same numbers") {
  auto check_same = [](const PolynomialView& a, const PolynomialView& b, int64_t rank) {
    const Matrix64 basis = shared_input_basis({&a, &b});
    REQUIRE(basis.cols == rank);
    const Matrix64 gram = matmul(basis, basis, true, false);  // QᵀQ = I
    for (int64_t i = 0; i < rank; ++i)
      for (int64_t j = 0; j < rank; ++j) CHECK(gram(i, j) == doctest::Approx(i == j ? 1.0 : 0.0).epsilon(1e-12));
    for (double s : {1.0, 0.8}) {
      const std::vector<double> plain = hermite_output_inner(hermite_expansion(a, s), hermite_expansion(b, s));
      const HermiteExpansion ra = hermite_expansion(a, s, &basis), rb = hermite_expansion(b, s, &basis);
      CHECK(ra.variables == rank * a.positions);
      const std::vector<double> reduced = hermite_output_inner(ra, rb);
      REQUIRE(reduced.size() == plain.size());
      for (size_t k = 0; k < plain.size(); ++k) CHECK(reduced[k] == doctest::Approx(plain[k]).epsilon(1e-10));
      Matrix64 flipped = basis;  // another basis of the same span: the same variables' count, not the same variables
      for (double& v : flipped.data) v = -v;
      CHECK_THROWS_WITH(hermite_output_inner(ra, hermite_expansion(b, s, &flipped)), doctest::Contains("different bases"));
    }
  };
  SUBCASE("depth-3 MLPs with embeddings of 2 on 12 inputs: 4 variables") {
    ModelConfig c = mlp_config(3, 12, 3, 2);
    c.dim = 2;
    check_same(random_view(c, 121), random_view(c, 122), 4);
  }
  SUBCASE("one-block LMs of dim 2 on 5 tokens: 4 variables a position") {
    ModelConfig c = lm_config(5, 2, 2, 2);
    c.mlp_ratio = 1;
    check_same(random_view(c, 123), random_view(c, 124), 4);
  }
  SUBCASE("a network without an embedding: no basis") {
    const PolynomialView a = random_view(mlp_config(2, 5, 3, 2), 125);
    CHECK(shared_input_basis({&a, &a}).cols == 0);
  }
}

TEST_CASE("tensor similarity of embedded depth-3 MLPs on a wide input: exact over the embeddings' span") {
  // 60 inputs at degree 8 are far over the budget; the two embeddings of 3 span 6 directions.
  ModelConfig c = mlp_config(3, 60, 4, 3);
  c.dim = 3, c.residual_scale = 2.0;
  Generator ga(131), gb(132), gr(133);
  const std::shared_ptr<Model> a = make_model(c, ga), b = make_model(c, gb), reference = make_model(c, gr);
  for (const Model* r : {static_cast<const Model*>(nullptr), static_cast<const Model*>(reference.get())}) {
    CAPTURE(r != nullptr);
    const TensorSimScore exact = tensor_similarity(*a, *b, TensorSimOptions{}, r);
    CHECK(exact.kind == "exact");
    // Two embeddings of 3 span 6 directions, three span 9.
    CHECK(exact.method.find(r ? "9 input variables, the span of their embeddings" : "6 input variables, the span of their embeddings") !=
          std::string::npos);
    const MonteCarloSimilarity mc = monte_carlo_check(*a, *b, TensorSimOptions{}, 100000, r, 11);
    MESSAGE("embedded depth 3", std::string(r ? ", (a − reference) against b" : ""), ": exact ", exact.total,
            ", Monte Carlo ", mc.similarity, " ± ", mc.similarity_se);
    CHECK(std::abs(exact.total - mc.similarity) < 4 * mc.similarity_se);
    for (size_t o = 0; o < mc.slices.size(); ++o) CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
  }
}

// ---- One attention block, one position at a time (analysis/similarity/attention_block_moments.h) ----

namespace {

// A random LM's view, its position embeddings scaled up from their 0.02 initialisation so that
// the constant terms they bring into every product count.
PolynomialView random_lm(const ModelConfig& c, uint64_t seed, float position_scale = 25.0f) {
  Generator g(seed);
  PolynomialView v = make_model(c, g)->polynomial_view();
  v.steps.front().bias = (v.steps.front().bias * position_scale).contiguous();
  return v;
}

std::vector<double> by_position(const PolynomialView& a, const PolynomialView& b, double input_std) {
  return attention_block_class_inner(a, b, input_std);
}

// Per class, summed over positions (what attention_block_class_inner gives).
std::vector<double> per_class(const std::vector<double>& per_output, int64_t classes) {
  std::vector<double> sums(size_t(classes), 0.0);
  for (size_t k = 0; k < per_output.size(); ++k) sums[k % size_t(classes)] += per_output[k];
  return sums;
}

// The route (each side in `variables` of its own) against the pair written out whole over both
// embeddings' span (shared_input_basis, `span` directions a position), per class, a·b and b·b.
void check_pair(const PolynomialView& a, const PolynomialView& b, int64_t variables, int64_t span) {
  CHECK(attention_block_cost(a, b).variables == variables);
  const Matrix64 basis = shared_input_basis({&a, &b});
  REQUIRE(basis.cols == span);
  for (double s : {0.9, 0.6}) {
    const HermiteExpansion ea = hermite_expansion(a, s, &basis), eb = hermite_expansion(b, s, &basis);
    for (const auto& [x, y, ex, ey] : {std::tuple{&a, &b, &ea, &eb}, std::tuple{&b, &b, &eb, &eb}}) {
      int64_t calls = 0, last = 0, total = 0;  // the progress it reports: every class, in order
      const std::vector<double> whole = per_class(hermite_output_inner(*ex, *ey), ex->classes),
                                paired = attention_block_class_inner(*x, *y, s, [&](int64_t done, int64_t of) {
                                  CHECK(done == last + 1);
                                  ++calls, last = done, total = of;
                                });
      CHECK(calls == ex->classes);
      CHECK(total == ex->classes);
      REQUIRE(whole.size() == paired.size());
      double largest = 0;
      for (double v : whole) largest = std::max(largest, std::abs(v));
      for (size_t k = 0; k < whole.size(); ++k) CHECK(paired[k] == doctest::Approx(whole[k]).epsilon(1e-10).scale(largest));
    }
  }
}

}  // namespace

TEST_CASE("attention block moments: the same numbers as the networks written out whole") {
  struct Case {
    ModelConfig a, b;
    double input_std;
  };
  ModelConfig narrow = lm_config(3, 3, 4, 2), single_head = lm_config(4, 2, 4, 1), wide = lm_config(3, 3, 6, 2);
  single_head.residual_scale = 0.5;
  const ModelConfig issue_width = lm_config(4, 3, 8, 2);  // dim 8, 2 heads: 12 variables, 4·10⁹ multiply-adds written out whole
  const Case cases[] = {{narrow, narrow, 1.0},       {narrow, narrow, 0.7},           {single_head, single_head, 1.0},
                        {narrow, wide, 0.8},         {issue_width, issue_width, 1.0}};
  uint64_t seed = 300;
  for (const Case& c : cases) {
    const PolynomialView a = random_lm(c.a, ++seed), b = random_lm(c.b, ++seed);
    REQUIRE(single_attention_block(a));
    CAPTURE(a.positions);
    CAPTURE(a.input_dim);
    CAPTURE(c.input_std);
    const HermiteExpansion ea = hermite_expansion(a, c.input_std), eb = hermite_expansion(b, c.input_std);
    for (const auto& [x, y, ex, ey] : {std::tuple{&a, &b, &ea, &eb}, std::tuple{&a, &a, &ea, &ea}}) {
      const std::vector<double> whole = per_class(hermite_output_inner(*ex, *ey), ex->classes);
      const std::vector<double> by_position = attention_block_class_inner(*x, *y, c.input_std);
      REQUIRE(by_position.size() == whole.size());
      double largest = 0;
      for (double v : whole) largest = std::max(largest, std::abs(v));
      for (size_t k = 0; k < whole.size(); ++k) {
        CAPTURE(k);
        CHECK(by_position[k] == doctest::Approx(whole[k]).epsilon(1e-9).scale(largest));
      }
    }
  }
}

TEST_CASE("attention block moments: more tokens than the width, each network in its own variables") {
  // Ten tokens, embeddings of width 2: each side is written in 2 variables a position and the
  // two paired by canonical correlation; the reference is the pair written out whole over the
  // 4 directions both embeddings span a position (shared_input_basis), 3 positions: 12 variables.
  const ModelConfig c = lm_config(10, 3, 2, 2);
  check_pair(random_lm(c, 401), random_lm(c, 402), 2, 4);
}

TEST_CASE("attention block moments: embeddings of unequal ranks, the narrower side padded") {
  // Widths 2 (one head) and 3 (one head of 3) on 10 tokens: 2 and 3 variables a position, paired
  // in 3 (the narrower side's third has no partner); the reference spans 5 directions a position.
  ModelConfig narrow = lm_config(10, 2, 2, 1), wider = lm_config(10, 2, 3, 1);
  narrow.mlp_ratio = wider.mlp_ratio = 2;
  check_pair(random_lm(narrow, 403), random_lm(wider, 404), 3, 5);
}

TEST_CASE("symmetric_eigen: by hand and on a random matrix") {
  Matrix64 m(2, 2, 1.0);
  m(0, 0) = m(1, 1) = 2.0;
  const SymmetricEigen two = symmetric_eigen(m);
  CHECK(two.values[0] == doctest::Approx(3.0).epsilon(1e-15));
  CHECK(two.values[1] == doctest::Approx(1.0).epsilon(1e-15));
  CHECK(std::abs(two.vectors(0, 0)) == doctest::Approx(std::sqrt(0.5)).epsilon(1e-15));
  Generator g(421);
  const Matrix64 x = to_matrix64(normal({7, 7}, 0.0f, 1.0f, g)), s = matmul(x, x, false, true);
  const SymmetricEigen e = symmetric_eigen(s);
  Matrix64 scaled = e.vectors;  // V·diag(λ)
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 7; ++j) scaled(i, j) *= e.values[size_t(j)];
  const Matrix64 back = matmul(scaled, e.vectors, false, true), vtv = matmul(e.vectors, e.vectors, true, false);
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      CHECK(back(i, j) == doctest::Approx(s(i, j)).scale(1.0).epsilon(1e-12));
      CHECK(vtv(i, j) == doctest::Approx(i == j ? 1.0 : 0.0).scale(1.0).epsilon(1e-13));
    }
  for (int64_t i = 0; i + 1 < 7; ++i) CHECK(e.values[size_t(i)] >= e.values[size_t(i + 1)]);
}

TEST_CASE("canonical pairing: each side's variables standard, paired one to one with the correlations") {
  Generator g(411);
  auto random_matrix = [&](int64_t rows, int64_t cols) { return to_matrix64(normal({rows, cols}, 0.0f, 1.0f, g)); };
  struct Case {
    const char* name;
    Matrix64 wa, wb;
    int64_t rank_a, rank_b;
  };
  const Matrix64 shared = random_matrix(3, 12);
  Matrix64 low_rank = matmul(random_matrix(5, 2), random_matrix(2, 12));  // 5 rows of rank 2
  Matrix64 overlapping = random_matrix(4, 12);
  for (int64_t j = 0; j < 12; ++j) overlapping(0, j) = shared(1, j);  // one direction in common
  const Case cases[] = {{"independent embeddings", random_matrix(4, 12), random_matrix(4, 12), 4, 4},
                        {"the same embedding", shared, shared, 3, 3},
                        {"ranks 2 and 4, one direction shared", low_rank, overlapping, 2, 4},
                        {"wider than the input", random_matrix(7, 5), random_matrix(3, 5), 5, 3},
                        {"a zero embedding", Matrix64(3, 12), random_matrix(2, 12), 0, 2},
                        {"two zero embeddings: one variable, unpaired", Matrix64(3, 12), Matrix64(2, 12), 0, 0}};
  for (const Case& k : cases) {
    CAPTURE(k.name);
    const CanonicalPairing p = canonical_pairing(k.wa, k.wb);
    const int64_t r = std::max({k.rank_a, k.rank_b, int64_t(1)});
    REQUIRE(p.read_a.cols == r);
    REQUIRE(p.correlation.size() == size_t(r));
    // PᵀP = I on each side's rank, P_aᵀP_b = diag(ρ), and W = W·P·Pᵀ (the rows' span kept).
    const Matrix64 aa = matmul(p.read_a, p.read_a, true, false), bb = matmul(p.read_b, p.read_b, true, false),
                   ab = matmul(p.read_a, p.read_b, true, false);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j) {
        CHECK(aa(i, j) == doctest::Approx(i == j && i < k.rank_a ? 1.0 : 0.0).scale(1.0).epsilon(1e-12));
        CHECK(bb(i, j) == doctest::Approx(i == j && i < k.rank_b ? 1.0 : 0.0).scale(1.0).epsilon(1e-12));
        CHECK(ab(i, j) == doctest::Approx(i == j ? p.correlation[size_t(i)] : 0.0).scale(1.0).epsilon(1e-12));
      }
    for (const auto& [w, read] : {std::pair{&k.wa, &p.read_a}, std::pair{&k.wb, &p.read_b}}) {
      const Matrix64 kept = matmul(matmul(*w, *read), *read, false, true);
      for (size_t i = 0; i < kept.data.size(); ++i) CHECK(kept.data[i] == doctest::Approx(w->data[i]).scale(1.0).epsilon(1e-12));
    }
    for (int64_t i = 0; i + 1 < r; ++i) CHECK(p.correlation[size_t(i)] >= p.correlation[size_t(i + 1)]);
    if (std::string(k.name) == "the same embedding")
      for (double rho : p.correlation) CHECK(rho == doctest::Approx(1.0).epsilon(1e-14));
    if (std::string(k.name) == "ranks 2 and 4, one direction shared") {
      CHECK(p.correlation[1] > 0.0);  // two directions a of rank-2 space can reach
      CHECK(p.correlation[2] == 0.0);
    }
  }
}

TEST_CASE("polynomial moments: He_β times a polynomial, in the Hermite basis") {
  // By hand in one variable: He₁·He₁ = He₂ + 1, He₂·He₂ = He₄ + 4·He₂ + 2.
  const DensePolynomial he1 = to_hermite(monomial(1, {1}, 1.0)), he2 = to_hermite(sum(monomial(1, {2}, 1.0), monomial(1, {0}, -1.0)));
  CHECK(he2.coefficients == std::vector<double>{0.0, 0.0, 1.0});
  CHECK(hermite_times(he1, {1}).coefficients == std::vector<double>{1.0, 0.0, 1.0});
  CHECK(hermite_times(he2, {2}).coefficients == std::vector<double>{2.0, 0.0, 4.0, 0.0, 1.0});
  // Against the product in monomials, converted: a random polynomial of degree 3 in 3
  // variables times every He_β of degree ≤ 2, each β's He_β written in monomials.
  Generator g(431);
  const std::vector<float> r = normal({20}, 0.0f, 1.0f, g).to_vector();
  const std::vector<std::vector<int>> cubic = layout_exponents(3, 3);
  REQUIRE(cubic.size() == 20);
  DensePolynomial p = monomial(3, {0, 0, 0}, 0.0);
  for (size_t i = 0; i < cubic.size(); ++i) accumulate(p, monomial(3, cubic[i], r[i]), 1.0);
  const DensePolynomial p_hat = to_hermite(p);
  for (const std::vector<int>& beta : layout_exponents(3, 2)) {
    CAPTURE(beta[0]);
    CAPTURE(beta[1]);
    CAPTURE(beta[2]);
    DensePolynomial he = monomial(3, {0, 0, 0}, 1.0);  // He_β = Π_v He_{β_v}(y_v), He₂ = y² − 1
    for (int v = 0; v < 3; ++v) {
      std::vector<int> one(3, 0), square(3, 0), none(3, 0);
      one[size_t(v)] = 1, square[size_t(v)] = 2;
      if (beta[size_t(v)] == 1) he = product(he, monomial(3, one, 1.0));
      if (beta[size_t(v)] == 2) he = product(he, sum(monomial(3, square, 1.0), monomial(3, none, -1.0)));
    }
    const DensePolynomial expected = to_hermite(product(p, he)), got = hermite_times(p_hat, beta);
    REQUIRE(got.degree == expected.degree);
    for (size_t i = 0; i < got.coefficients.size(); ++i)
      CHECK(got.coefficients[i] == doctest::Approx(expected.coefficients[i]).scale(1.0).epsilon(1e-12));
  }
  // Truncation to a lower degree keeps what an inner product with that degree reads.
  const DensePolynomial low = at_degree(p_hat, 1);
  CHECK(low.degree == 1);
  const DensePolynomial y0 = monomial(3, {1, 0, 0}, 1.0);  // He_(1,0,0) too
  CHECK(hermite_inner(low, y0) == doctest::Approx(hermite_inner(p_hat, y0)).epsilon(1e-14));
  CHECK(hermite_inner(low, y0) != 0.0);
}

TEST_CASE("polynomial moments: the Gram matrix of correlated variables by hand (Mehler)") {
  // a, b standard normal with correlation ρ: E[a·b] = ρ, E[a²·b²] = 1 + 2ρ², E[He₂(a)·He₂(b)] = 2ρ²,
  // E[a³·b] = 3ρ; a second variable pair with correlation σ: E[a·a'·b·b'] = ρσ.
  const double rho = 0.3, sigma = -0.6;
  auto hermite = [](DensePolynomial p) { return to_hermite(std::move(p)); };
  const std::vector<DensePolynomial> a = {hermite(monomial(2, {1, 0}, 1.0)), hermite(monomial(2, {2, 0}, 1.0)),
                                          hermite(monomial(2, {3, 0}, 1.0)), hermite(monomial(2, {1, 1}, 1.0))};
  const std::vector<DensePolynomial> b = {hermite(monomial(2, {1, 0}, 1.0)), hermite(monomial(2, {2, 0}, 1.0)),
                                          hermite(monomial(2, {1, 1}, 1.0))};
  const Matrix64 g = hermite_gram(a, b, {rho, sigma});
  CHECK(g(0, 0) == doctest::Approx(rho).epsilon(1e-15));
  CHECK(g(1, 1) == doctest::Approx(1 + 2 * rho * rho).epsilon(1e-15));
  CHECK(g(1, 0) == doctest::Approx(0.0).scale(1.0).epsilon(1e-15));
  CHECK(g(2, 0) == doctest::Approx(3 * rho).epsilon(1e-15));
  CHECK(g(3, 2) == doctest::Approx(rho * sigma).epsilon(1e-15));
  CHECK(g(1, 2) == doctest::Approx(0.0).scale(1.0).epsilon(1e-15));
  // ρ = 1 on every variable: the plain Gram matrix.
  const Matrix64 same = hermite_gram(a, b, {1.0, 1.0}), plain = hermite_gram(a, b);
  for (size_t i = 0; i < plain.data.size(); ++i) CHECK(same.data[i] == plain.data[i]);
  CHECK_THROWS_WITH_AS(hermite_gram(a, b, {rho}), doctest::Contains("1 correlations for polynomials in 2 variables"), Error);
}

TEST_CASE("attention block moments: independent LMs of 4 positions × 7 tokens against Monte Carlo") {
  // dim 8, 2 heads (analysis/results/tensor_similarity.md): 28 input variables, beyond the whole-network route.
  ModelConfig c = lm_config(7, 4, 8, 2);
  SUBCASE("independent") {
    const PolynomialView a = random_lm(c, 501, 1.0f), b = random_lm(c, 502, 1.0f);
    CHECK(polynomial_cost(a).multiply_adds > 1e12);
    CHECK(check_against_monte_carlo(a, b, 1.0, 200000, 503, true, by_position) > 8);  // a pair the recursion gets wrong
  }
  SUBCASE("independent blocks between a shared embedding and unembedding, residual scale 0.5") {
    c.residual_scale = 0.5;
    const PolynomialView a = random_lm(c, 511);
    PolynomialView b = random_lm(c, 512);
    b.steps.front() = a.steps.front(), b.steps.back() = a.steps.back();
    check_against_monte_carlo(a, b, 0.8, 200000, 513, false, by_position);
  }
}
