// Tensor similarity (analysis/similarity/tensor_similarity.h, analysis/similarity/second_moment.h) and the
// polynomial view of bilinear models it reads (models/polynomial.h): the view against the
// models' forward, the closed forms against explicit tensors, Isserlis' formula and Monte
// Carlo, and the deep recursion against Monte Carlo.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "analysis/common/plot.h"
#include "analysis/similarity/attention_moments.h"
#include "analysis/similarity/second_moment.h"
#include "analysis/similarity/tensor_similarity.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/model.h"
#include "ops/elementwise.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

Matrix64 random_matrix(int64_t rows, int64_t cols, uint64_t seed, double scale = 1.0) {
  const std::vector<float> v = adjoint::testing::random_tensor({rows, cols}, seed).to_vector();
  Matrix64 m(rows, cols);
  for (size_t i = 0; i < v.size(); ++i) m.data[i] = scale * v[i];
  return m;
}

BilinearForm random_form(int64_t d, int64_t hidden, int64_t outputs, uint64_t seed) {
  return {random_matrix(hidden, d + 1, seed), random_matrix(hidden, d + 1, seed + 1), random_matrix(outputs, hidden, seed + 2)};
}

// x = μ + S z with random μ and S (d × d): N(μ, S Sᵀ), and S itself for sampling.
struct RandomInput {
  InputDistribution distribution;
  Matrix64 root;
};
RandomInput random_input(int64_t d, uint64_t seed) {
  RandomInput r{{random_matrix(d, 1, seed, 0.5), Matrix64()}, random_matrix(d, d, seed + 1, 0.6)};
  r.distribution.covariance = matmul(r.root, r.root, false, true);
  return r;
}

// Rows and columns 1.. of a (d+1)×(d+1) matrix: the part acting on x alone.
Matrix64 without_bias(const Matrix64& m) {
  Matrix64 out(m.rows - 1, m.cols - 1);
  for (int64_t i = 1; i < m.rows; ++i)
    for (int64_t j = 1; j < m.cols; ++j) out(i - 1, j - 1) = m(i, j);
  return out;
}

// E[x̃ᵀBx̃ · x̃ᵀCx̃] for x̃ = (1, x), x ~ N(0, I), B and C symmetric, written out from the
// block form of docs/methods.md §3.2: (b00 + Tr B')(c00 + Tr C') + 4 b0·c0 + 2⟨B', C'⟩_F.
double isserlis_block_formula(const Matrix64& b, const Matrix64& c) {
  double tb = b(0, 0), tc = c(0, 0), cross = 0, frob = 0;
  for (int64_t i = 1; i < b.rows; ++i) {
    tb += b(i, i), tc += c(i, i), cross += b(0, i) * c(0, i);
    for (int64_t j = 1; j < b.cols; ++j) frob += b(i, j) * c(i, j);
  }
  return tb * tc + 4 * cross + 2 * frob;
}

// Sample means of A_o(x)·B_o(x) for x ~ N(0, I), evaluated from the factors.
std::vector<double> monte_carlo_slices(const BilinearForm& a, const BilinearForm& b, int64_t samples, uint64_t seed) {
  Generator gen(seed);
  const int64_t d = a.inputs();
  const std::vector<float> x = normal({samples, d}, 0.0f, 1.0f, gen).to_vector();
  std::vector<double> out(size_t(a.outputs()), 0.0);
  auto eval = [&](const BilinearForm& f, const float* xs, std::vector<double>& y) {
    y.assign(size_t(f.outputs()), 0.0);
    for (int64_t h = 0; h < f.hidden(); ++h) {
      double l = f.left(h, 0), r = f.right(h, 0);
      for (int64_t i = 0; i < d; ++i) l += f.left(h, i + 1) * xs[i], r += f.right(h, i + 1) * xs[i];
      for (int64_t o = 0; o < f.outputs(); ++o) y[size_t(o)] += f.down(o, h) * l * r;
    }
  };
  std::vector<double> ya, yb;
  for (int64_t n = 0; n < samples; ++n) {
    eval(a, x.data() + n * d, ya), eval(b, x.data() + n * d, yb);
    for (size_t o = 0; o < out.size(); ++o) out[o] += ya[o] * yb[o] / double(samples);
  }
  return out;
}

ModelConfig bilinear_config(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.num_classes = 5;
  c.in_channels = 1;
  c.image_size = 3;  // 9 inputs
  c.hidden = 6;
  return c;
}

// Makes b a relative of a (as two checkpoints of one run are): a's weights plus b's own
// initial weights at a third of their size, as noise.
void make_relative(const Model& a, Model& b) {
  for (const auto& [name, t] : b.named_parameters()) {
    Tensor target = t;
    const std::vector<float> own = a.state_dict().at(name).to_vector(), noise = t.to_vector();
    std::vector<float> mixed(own.size());
    for (size_t i = 0; i < own.size(); ++i) mixed[i] = own[i] + noise[i] / 3;
    target.copy_from(Tensor::from_vector(t.shape(), mixed));
  }
}

std::vector<double> to_double(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector();
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("polynomial view: evaluating the view gives the models' forward") {
  NoGrad off;
  SUBCASE("bilinear_mlp, one layer, with and without an embedding") {
    for (int64_t dim : {0, 4}) {
      CAPTURE(dim);
      ModelConfig c = bilinear_config("bilinear_mlp");
      c.dim = dim;
      Generator gen(3);
      auto model = make_model(c, gen);
      const Tensor x = adjoint::testing::random_tensor({7, 1, 3, 3}, 11);
      const PolynomialView view = model->polynomial_view();
      CHECK(view.input_dim == 9);
      CHECK(view.output_dim() == 5);
      const std::vector<double> y = evaluate_polynomial(view, to_double(x), 7), want = to_double(model->forward(x));
      REQUIRE(y.size() == want.size());
      for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-4));
    }
  }
  SUBCASE("bilinear_mlp, three residual blocks") {
    ModelConfig c = bilinear_config("bilinear_mlp");
    c.dim = 4, c.depth = 3, c.residual_scale = 0.5;
    Generator gen(4);
    auto model = make_model(c, gen);
    CHECK(model->num_blocks() == 5);  // embed, blocks.0-2, head
    const Tensor x = adjoint::testing::random_tensor({5, 9}, 12);
    const PolynomialView view = model->polynomial_view();
    REQUIRE(view.steps.size() == 5);
    CHECK(view.steps[2].name == "blocks.1");
    CHECK(view.steps[2].residual);
    const std::vector<double> y = evaluate_polynomial(view, to_double(x), 5), want = to_double(model->forward(x));
    for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-4));
  }
  SUBCASE("bilinear_lm with bilinear attention: one-hot tokens") {
    // A residual scale of 1 skips its product in the model (models/bilinear.cpp), never in the view.
    for (const double scale : {0.7, 1.0}) {
      CAPTURE(scale);
      ModelConfig c;
      c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = 7, c.seq_len = 4, c.dim = 8, c.depth = 2, c.heads = 2;
      c.mlp_ratio = 2, c.residual_scale = scale;
      Generator gen(5);
      auto model = make_model(c, gen);
      const std::vector<float> ids = {0, 3, 6, 2, 5, 5, 1, 4};
      const Tensor tokens = Tensor::from_vector({2, 4}, ids);
      std::vector<double> onehot(2 * 4 * 7, 0.0);
      for (size_t i = 0; i < ids.size(); ++i) onehot[i * 7 + size_t(ids[i])] = 1.0;
      const PolynomialView view = model->polynomial_view(4);
      CHECK(view.positions == 4);
      CHECK(view.steps.size() == 6);  // embed, (attn, mlp) × 2, unembed
      const std::vector<double> y = evaluate_polynomial(view, onehot, 2), want = to_double(model->forward(tokens));
      REQUIRE(y.size() == want.size());
      for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(want[i]).epsilon(1e-4).scale(1e-3));
    }
  }
}

TEST_CASE("polynomial view: non-polynomial layers are refused by name") {
  Generator gen(1);
  ModelConfig lm;
  lm.arch = "bilinear_lm", lm.vocab = 5, lm.seq_len = 3, lm.dim = 4, lm.depth = 1, lm.heads = 1;
  lm.attention = "softmax";
  CHECK_THROWS_WITH_AS(make_model(lm, gen)->polynomial_view(), doctest::Contains("blocks.0.attn is softmax attention"),
                       Error);
  lm.attention = "bilinear", lm.layer_norm = true;
  CHECK_THROWS_WITH_AS(make_model(lm, gen)->polynomial_view(), doctest::Contains("blocks.0.norm1 is a LayerNorm"), Error);
  ModelConfig r;
  r.arch = "resnet18", r.width = 0.125, r.in_channels = 1, r.image_size = 8;
  CHECK_THROWS_WITH_AS(make_model(r, gen)->polynomial_view(), doctest::Contains("resnet18: the ReLU after 'bn1' is not polynomial"),
                       Error);
  ModelConfig v;
  v.arch = "vit_custom", v.dim = 8, v.depth = 1, v.heads = 2, v.in_channels = 1, v.image_size = 8, v.patch = 4;
  CHECK_THROWS_WITH_AS(make_model(v, gen)->polynomial_view(), doctest::Contains("blocks.0.norm1 is a LayerNorm"), Error);
  ModelConfig g;
  g.arch = "vgg11_bn", g.width = 0.125, g.in_channels = 1, g.image_size = 32;
  CHECK_THROWS_WITH_AS(make_model(g, gen)->polynomial_view(), doctest::Contains("'features.0' is not polynomial"), Error);
}

TEST_CASE("tensor similarity: the identity metric is the symmetrised tensors' inner product") {
  const BilinearForm a = random_form(4, 3, 2, 10), b = random_form(4, 5, 2, 20);
  const SimilarityMetric& identity = similarity_metric("identity");
  for (bool bias : {true, false}) {
    CAPTURE(bias);
    const std::vector<double> closed = slice_inner(identity, a, b, bias);
    for (int64_t o = 0; o < 2; ++o) {
      Matrix64 sa = symmetric_slice(a, o), sb = symmetric_slice(b, o);
      if (!bias) sa = without_bias(sa), sb = without_bias(sb);
      CHECK(closed[size_t(o)] == doctest::Approx(frobenius_inner(sa, sb)).epsilon(1e-12));
    }
  }
  // Functionally equal layers score 1: hidden units permuted, L and R swapped, L scaled by
  // 3 and D by 1/3. A different layer does not.
  BilinearForm same = a;
  for (int64_t c = 0; c < 5; ++c) std::swap(same.left(0, c), same.right(0, c));
  for (int64_t c = 0; c < 5; ++c) std::swap(same.left(1, c), same.left(2, c)), std::swap(same.right(1, c), same.right(2, c));
  for (int64_t o = 0; o < 2; ++o) std::swap(same.down(o, 1), same.down(o, 2));
  for (int64_t c = 0; c < 5; ++c) same.left(0, c) *= 3;
  for (int64_t o = 0; o < 2; ++o) same.down(o, 0) /= 3;
  const InputDistribution input = random_input(4, 11).distribution;  // the data metric's
  for (const SimilarityMetric& m : similarity_metrics()) {
    CAPTURE(m.name);
    const Similarity s = tensor_similarity(m, a, same, true, &input);
    CHECK(s.total == doctest::Approx(1.0).epsilon(1e-12));
    for (double v : s.slices) CHECK(v == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(std::abs(tensor_similarity(m, a, b, true, &input).total) < 0.9);
  }
}

TEST_CASE("tensor similarity: the Gaussian metric matches Isserlis' block formula and Monte Carlo") {
  const BilinearForm a = random_form(3, 4, 2, 30), b = random_form(3, 2, 2, 40);
  const std::vector<double> closed = slice_inner(similarity_metric("gaussian"), a, b, true);
  const std::vector<double> mc = monte_carlo_slices(a, b, 400000, 7);
  for (int64_t o = 0; o < 2; ++o) {
    CAPTURE(o);
    CHECK(closed[size_t(o)] == doctest::Approx(isserlis_block_formula(symmetric_slice(a, o), symmetric_slice(b, o))).epsilon(1e-12));
    CHECK(closed[size_t(o)] == doctest::Approx(mc[size_t(o)]).epsilon(0.02));  // Monte Carlo within 2%
  }
  // Without the bias coordinate: the quadratic parts alone, E = Tr B' Tr C' + 2⟨B', C'⟩.
  const std::vector<double> quad = slice_inner(similarity_metric("gaussian"), a, b, false);
  for (int64_t o = 0; o < 2; ++o) {
    const Matrix64 sa = without_bias(symmetric_slice(a, o)), sb = without_bias(symmetric_slice(b, o));
    double ta = 0, tb = 0;
    for (int64_t i = 0; i < sa.rows; ++i) ta += sa(i, i), tb += sb(i, i);
    CHECK(quad[size_t(o)] == doctest::Approx(ta * tb + 2 * frobenius_inner(sa, sb)).epsilon(1e-12));
  }
}

TEST_CASE("tensor similarity: difference tensors are linear, and bad pairs are refused") {
  const BilinearForm a = random_form(4, 3, 3, 50), a0 = random_form(4, 6, 3, 60), b = random_form(4, 2, 3, 70);
  const InputDistribution input = random_input(4, 51).distribution;  // the data metric's
  for (const SimilarityMetric& m : similarity_metrics()) {
    CAPTURE(m.name);
    const std::vector<double> d = slice_inner(m, difference(a, a0), b, true, &input);
    const std::vector<double> x = slice_inner(m, a, b, true, &input), y = slice_inner(m, a0, b, true, &input);
    if (std::string(m.name) == "identity")
      for (size_t o = 0; o < d.size(); ++o) CHECK(d[o] == doctest::Approx(x[o] - y[o]).epsilon(1e-12));
  }
  // Against itself the difference has zero norm.
  const std::vector<double> zero = slice_inner(similarity_metric("identity"), difference(a, a), difference(a, a), true);
  for (double v : zero) CHECK(std::abs(v) < 1e-12);
  CHECK_THROWS_WITH_AS(tensor_similarity(similarity_metric("identity"), a, random_form(5, 3, 3, 1), true),
                       doctest::Contains("layers of 4→3 and 5→3 cannot be compared"), Error);
  CHECK_THROWS_WITH_AS(similarity_metric("cosine"), doctest::Contains("unknown metric 'cosine' (identity, gaussian, data)"),
                       UsageError);
}

TEST_CASE("tensor similarity: a one-layer model's folded form is its polynomial") {
  ModelConfig c = bilinear_config("bilinear_mlp");
  c.dim = 4;  // the embedding folds into L and R
  Generator gen(8);
  auto model = make_model(c, gen);
  const PolynomialView view = model->polynomial_view();
  const BilinearForm f = bilinear_form(view);
  CHECK(f.inputs() == 9);
  CHECK(f.outputs() == 5);
  const std::vector<double> x = to_double(adjoint::testing::random_tensor({3, 9}, 9));
  const std::vector<double> want = evaluate_polynomial(view, x, 3);
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t o = 0; o < 5; ++o) {
      const Matrix64 s = symmetric_slice(f, o);
      double y = s(0, 0);
      for (int64_t i = 0; i < 9; ++i) {
        y += 2 * s(0, i + 1) * x[size_t(n * 9 + i)];
        for (int64_t j = 0; j < 9; ++j) y += s(i + 1, j + 1) * x[size_t(n * 9 + i)] * x[size_t(n * 9 + j)];
      }
      CHECK(y == doctest::Approx(want[size_t(n * 5 + o)]).epsilon(1e-9));
    }
  c.depth = 2;
  CHECK_THROWS_WITH_AS(bilinear_form(make_model(c, gen)->polynomial_view()),
                       doctest::Contains("layer 'blocks.1' makes this more than one bilinear layer"), Error);
}

TEST_CASE("second-moment recursion: exact for one layer, close to Monte Carlo for deeper stacks") {
  SUBCASE("one layer equals the Gaussian closed form") {
    ModelConfig c = bilinear_config("bilinear_mlp");
    c.dim = 4;
    Generator ga(1), gb(2);
    const PolynomialView a = make_model(c, ga)->polynomial_view(), b = make_model(c, gb)->polynomial_view();
    const DeepSimilarity deep = deep_similarity(a, b);
    const Similarity closed = tensor_similarity(similarity_metric("gaussian"), bilinear_form(a), bilinear_form(b), true);
    CHECK(deep.similarity == doctest::Approx(closed.total).epsilon(1e-10));
    REQUIRE(deep.slices.size() == closed.slices.size());
    for (size_t o = 0; o < closed.slices.size(); ++o) CHECK(deep.slices[o] == doctest::Approx(closed.slices[o]).epsilon(1e-10));
    CHECK(deep_similarity(a, a).similarity == doctest::Approx(1.0).epsilon(1e-12));
  }
  SUBCASE("residual stacks of 2 and 3 blocks") {
    for (int64_t depth : {2, 3}) {
      CAPTURE(depth);
      ModelConfig c = bilinear_config("bilinear_mlp");
      c.dim = 5, c.depth = depth, c.residual_scale = 0.5;
      Generator ga(10 + depth), gb(20 + depth);
      auto ma = make_model(c, ga), mb = make_model(c, gb);
      make_relative(*ma, *mb);
      const PolynomialView a = ma->polynomial_view(), b = mb->polynomial_view();
      const DeepSimilarity deep = deep_similarity(a, b);
      const DeepSimilarity mc = monte_carlo_similarity(a, b, 400000, 99);
      MESSAGE("depth ", depth, ": recursion ", deep.similarity, ", Monte Carlo ", mc.similarity, "; E[fa·fb] ",
              deep.inner_ab, " vs ", mc.inner_ab, ", E[fa·fa] ", deep.inner_aa, " vs ", mc.inner_aa);
      CHECK(deep.similarity > 0.5);
      CHECK(deep.similarity == doctest::Approx(mc.similarity).epsilon(0.01).scale(0));
      CHECK(deep.inner_ab == doctest::Approx(mc.inner_ab).epsilon(0.03).scale(0));
      CHECK(deep_similarity(a, a).similarity == doctest::Approx(1.0).epsilon(1e-12));
    }
  }
}

TEST_CASE("attention moments: the non-centred Isserlis sum runs over every partial matching") {
  // Telephone numbers: partial matchings of n legs, a(n) = a(n-1) + (n-1)·a(n-2).
  const std::vector<int64_t> want = {1, 1, 2, 4, 10, 26, 76, 232, 764, 2620, 9496};
  for (int64_t n = 1; n <= 10; ++n) CHECK(partial_matchings(n) == want[size_t(n)]);
}

namespace {

// A small bilinear-attention LM and a relative of it (its weights plus noise a third their size).
std::pair<PolynomialView, PolynomialView> related_lms(int64_t depth, int64_t positions, bool mlp, double scale) {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = 5, c.seq_len = positions, c.dim = 4, c.depth = depth;
  c.heads = 2, c.mlp_ratio = 1, c.residual_scale = scale;
  Generator ga(30 + depth), gb(40 + depth);
  auto ma = make_model(c, ga), mb = make_model(c, gb);
  make_relative(*ma, *mb);
  Tensor embed = mb->state_dict().at("embed.weight");  // and b's embedding at half the scale
  {
    NoGrad off;
    embed.copy_from(embed * 0.5f);
  }
  PolynomialView a = ma->polynomial_view(positions), b = mb->polynomial_view(positions);
  if (!mlp)  // attention only: drop the MLP steps
    for (PolynomialView* v : {&a, &b})
      v->steps.erase(std::remove_if(v->steps.begin(), v->steps.end(),
                                    [](const PolynomialStep& s) { return s.kind == PolynomialStep::Kind::Bilinear; }),
                     v->steps.end());
  return {a, b};
}

}  // namespace

TEST_CASE("second-moment recursion: bilinear attention against Monte Carlo") {
  SUBCASE("one attention layer on the input: exact") {
    const auto [a, b] = related_lms(1, 3, false, 0.5);
    const DeepSimilarity deep = deep_similarity(a, b);
    const DeepSimilarity mc = monte_carlo_similarity(a, b, 1000000, 5);
    MESSAGE("one attention layer: recursion ", deep.similarity, " (E[fa·fb] ", deep.inner_ab, ", E[fa²] ", deep.inner_aa,
            "), Monte Carlo ", mc.similarity, " (", mc.inner_ab, ", ", mc.inner_aa, ")");
    CHECK(deep.similarity == doctest::Approx(mc.similarity).epsilon(0.02).scale(0));
    CHECK(deep.inner_ab == doctest::Approx(mc.inner_ab).epsilon(0.02).scale(0));
    CHECK(deep_similarity(a, a).similarity == doctest::Approx(1.0).epsilon(1e-12));
    // Inputs x ~ N(0, 0.6²·I) (--input-std), on both sides of the comparison.
    const DeepSimilarity narrow = deep_similarity(a, b, 0.6), narrow_mc = monte_carlo_similarity(a, b, 1000000, 8, 0.6);
    MESSAGE("input std 0.6: recursion ", narrow.similarity, ", Monte Carlo ", narrow_mc.similarity);
    CHECK(narrow.inner_ab == doctest::Approx(narrow_mc.inner_ab).epsilon(0.02).scale(0));
    CHECK(std::abs(narrow.inner_ab - deep.inner_ab) > 0.1 * deep.inner_ab);
  }
  SUBCASE("one block: attention, then the bilinear MLP under the Gaussian closure") {
    // The MLP after the attention sees a state that is no longer Gaussian: the closure's error,
    // reported, and small at a residual scale of 0.3 (at 0.5 it reached 0.86 against 0.66).
    const auto [a, b] = related_lms(1, 2, true, 0.3);
    const DeepSimilarity deep = deep_similarity(a, b);
    const DeepSimilarity mc = monte_carlo_similarity(a, b, 1000000, 6);
    MESSAGE("attention + MLP, scale 0.3: recursion ", deep.similarity, ", Monte Carlo ", mc.similarity);
    CHECK(deep.similarity == doctest::Approx(mc.similarity).epsilon(0.05).scale(0));
  }
}

TEST_CASE("second-moment recursion: mismatched networks are refused by name") {
  Generator g(1);
  ModelConfig m = bilinear_config("bilinear_mlp");
  m.dim = 4, m.depth = 2;
  const PolynomialView two = make_model(m, g)->polynomial_view();
  m.depth = 3;
  const PolynomialView three = make_model(m, g)->polynomial_view();
  CHECK_THROWS_WITH_AS(deep_similarity(two, three), doctest::Contains("has 4 layers and bilinear_mlp has 5"), Error);
}

namespace {

// Sample means of A_o(x)·B_o(x) for x = μ + S z, z ~ N(0, I): the data metric's reference.
std::vector<double> monte_carlo_slices_on(const BilinearForm& a, const BilinearForm& b, const RandomInput& input,
                                          int64_t samples, uint64_t seed) {
  Generator gen(seed);
  const int64_t d = a.inputs();
  const std::vector<float> z = normal({samples, d}, 0.0f, 1.0f, gen).to_vector();
  Matrix64 x(samples, d);
  for (int64_t n = 0; n < samples; ++n)
    for (int64_t i = 0; i < d; ++i) {
      x(n, i) = input.distribution.mean(i, 0);
      for (int64_t j = 0; j < d; ++j) x(n, i) += input.root(i, j) * z[size_t(n * d + j)];
    }
  auto output = [&](const BilinearForm& f, int64_t n, int64_t o) {
    double y = 0;
    for (int64_t h = 0; h < f.hidden(); ++h) {
      double l = f.left(h, 0), r = f.right(h, 0);
      for (int64_t i = 0; i < d; ++i) l += f.left(h, i + 1) * x(n, i), r += f.right(h, i + 1) * x(n, i);
      y += f.down(o, h) * l * r;
    }
    return y;
  };
  std::vector<double> out(size_t(a.outputs()), 0.0);
  for (int64_t n = 0; n < samples; ++n)
    for (int64_t o = 0; o < a.outputs(); ++o) out[size_t(o)] += output(a, n, o) * output(b, n, o) / double(samples);
  return out;
}

}  // namespace

TEST_CASE("tensor similarity: the data metric is the Gaussian of the data's mean and covariance") {
  const BilinearForm a = random_form(3, 4, 2, 130), b = random_form(3, 2, 2, 140);
  const RandomInput input = random_input(3, 150);
  const SimilarityMetric& data = similarity_metric("data");
  const std::vector<double> closed = slice_inner(data, a, b, true, &input.distribution);
  const std::vector<double> mc = monte_carlo_slices_on(a, b, input, 400000, 9);
  const std::vector<double> standard = slice_inner(similarity_metric("gaussian"), a, b, true);
  for (size_t o = 0; o < 2; ++o) {
    CAPTURE(o);
    MESSAGE("slice ", o, ": data metric ", closed[o], ", Monte Carlo ", mc[o], ", N(0, I) ", standard[o]);
    CHECK(closed[o] == doctest::Approx(mc[o]).epsilon(0.03));  // Monte Carlo within 3%
    CHECK(std::abs(closed[o] - standard[o]) > 0.1 * std::abs(closed[o]));  // not the standard Gaussian
  }
  // N(0, I) as the data: the Gaussian metric itself.
  const InputDistribution unit{Matrix64(3, 1), Matrix64::identity(3)};
  const std::vector<double> same = slice_inner(data, a, b, true, &unit);
  for (size_t o = 0; o < 2; ++o) CHECK(same[o] == doctest::Approx(standard[o]).epsilon(1e-12));
  // The statistics of samples: mean and covariance divided by N.
  Matrix64 samples(3, 2);
  samples.data = {1, 0, 3, 2, 5, 4};
  const InputDistribution d = input_distribution(samples);
  CHECK(d.mean(0, 0) == doctest::Approx(3.0));
  CHECK(d.mean(1, 0) == doctest::Approx(2.0));
  CHECK(d.covariance(0, 0) == doctest::Approx(8.0 / 3));
  CHECK(d.covariance(0, 1) == doctest::Approx(8.0 / 3));
  CHECK_THROWS_WITH_AS(slice_inner(data, a, b, true), doctest::Contains("needs the data's mean and covariance"), Error);
}

TEST_CASE("tensor similarity: a residual layer (bilinear_mlp --depth 1) is one layer's closed form") {
  for (int64_t dim : {0, 4}) {
    CAPTURE(dim);
    ModelConfig c = bilinear_config("bilinear_mlp");
    c.dim = dim, c.depth = 1, c.residual_scale = 0.5;
    Generator gen(18);
    auto model = make_model(c, gen);
    const PolynomialView view = model->polynomial_view();
    const BilinearForm f = bilinear_form(view);
    const int64_t d = view.input_dim, O = f.outputs();
    const std::vector<double> x = to_double(adjoint::testing::random_tensor({3, d}, 19));
    const std::vector<double> want = evaluate_polynomial(view, x, 3);
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t o = 0; o < O; ++o) {
        const Matrix64 s = symmetric_slice(f, o);
        double y = s(0, 0);
        for (int64_t i = 0; i < d; ++i) {
          y += 2 * s(0, i + 1) * x[size_t(n * d + i)];
          for (int64_t j = 0; j < d; ++j) y += s(i + 1, j + 1) * x[size_t(n * d + i)] * x[size_t(n * d + j)];
        }
        CHECK(y == doctest::Approx(want[size_t(n * O + o)]).epsilon(1e-9));
      }
    // The closed form equals the recursion, exact for one layer.
    Generator other(28);
    const PolynomialView v2 = make_model(c, other)->polynomial_view();
    CHECK(tensor_similarity(similarity_metric("gaussian"), f, bilinear_form(v2), true).total ==
          doctest::Approx(deep_similarity(view, v2).similarity).epsilon(1e-9));
  }
}

TEST_CASE("tensor similarity: a zero tensor is refused, a zero slice is undefined") {
  const BilinearForm a = random_form(4, 3, 3, 160), b = random_form(4, 5, 3, 170);
  for (const SimilarityMetric& m : {similarity_metric("identity"), similarity_metric("gaussian")}) {
    CAPTURE(m.name);
    CHECK_THROWS_WITH_AS(tensor_similarity(m, difference(a, a), b, true),
                         doctest::Contains("the first layer's tensor has zero norm"), Error);
    CHECK_THROWS_WITH_AS(tensor_similarity(m, b, difference(a, a), true),
                         doctest::Contains("the second layer's tensor has zero norm"), Error);
    BilinearForm quiet = a;  // output 1 never moves
    for (int64_t h = 0; h < quiet.hidden(); ++h) quiet.down(1, h) = 0;
    const Similarity s = tensor_similarity(m, quiet, b, true);
    CHECK(std::isnan(s.slices[1]));
    CHECK(std::isfinite(s.slices[0]));
    CHECK(std::isfinite(s.total));
    CHECK(s.total == doctest::Approx(s.inner_ab / std::sqrt(s.inner_aa * s.inner_bb)).epsilon(1e-15));
  }
}

TEST_CASE("tensor similarity: all pairs at once equal the pairs one by one, at any thread count") {
  std::vector<BilinearForm> forms;
  for (int64_t k = 0; k < 5; ++k) forms.push_back(random_form(6, 2 + k, 3, 200 + 10 * uint64_t(k)));
  const RandomInput input = random_input(6, 250);
  for (const SimilarityMetric& m : similarity_metrics()) {
    CAPTURE(m.name);
    std::vector<PreparedLayer> layers;
    for (const BilinearForm& f : forms) layers.push_back(prepare_layer(m, f, true, &input.distribution));
    const std::vector<Similarity> all = pairwise_similarity(layers);
    for (size_t i = 0; i < forms.size(); ++i)
      for (size_t j = 0; j < forms.size(); ++j) {
        const Similarity one = tensor_similarity(m, forms[i], forms[j], true, &input.distribution);
        CHECK(all[i * 5 + j].total == doctest::Approx(one.total).epsilon(1e-12));
        CHECK(all[i * 5 + j].inner_aa == doctest::Approx(one.inner_aa).epsilon(1e-12));
        CHECK(all[i * 5 + j].slices[2] == doctest::Approx(one.slices[2]).epsilon(1e-12));
      }
    const int previous = num_threads();
    set_num_threads(1);
    const std::vector<Similarity> serial = pairwise_similarity(layers);
    set_num_threads(previous);
    for (size_t k = 0; k < all.size(); ++k) CHECK(serial[k].total == all[k].total);
  }
  std::vector<PreparedLayer> mixed = {prepare_layer(similarity_metric("identity"), forms[0], true),
                                      prepare_layer(similarity_metric("identity"), random_form(5, 2, 3, 1), true)};
  CHECK_THROWS_WITH_AS(pairwise_similarity(mixed), doctest::Contains("cannot be compared"), Error);
}

TEST_CASE("pairwise heat-map: scaled to the data, with a colour bar") {
  // Values between 0.97 and 1: on a fixed ±1 scale all one red; here white to red.
  const std::vector<double> values = {1.0, 0.97, 0.985, 0.97, 1.0, NAN, 0.985, NAN, 1.0};
  const HeatmapFigure f = data_scaled_heatmap("t", values, 3, 3, {"10", "20", "30"}, "step", "tensor similarity", 12);
  CHECK(f.lo == 0.97);
  CHECK(f.hi == 1.0);
  const auto centre = [&](int64_t r, int64_t c) { return f.image.at(f.left + c * f.cell + f.cell / 2, f.top + r * f.cell + f.cell / 2); };
  CHECK(centre(0, 0) == Rgb{255, 0, 0});      // the largest value: red
  CHECK(centre(0, 1) == Rgb{255, 255, 255});  // the smallest: white
  const Rgb middle = centre(0, 2);            // half way: half faded
  CHECK(middle.r == 255);
  CHECK(std::abs(int(middle.g) - 128) <= 1);
  CHECK(centre(1, 2) == Rgb{200, 200, 200});  // not finite: grey
  // The bar: red at its top, white at its bottom, black tick marks beside it.
  const int64_t bar_x = f.bar_left + f.bar_width / 2, bottom = f.top + 3 * f.cell - 1;
  CHECK(f.image.at(bar_x, f.top) == Rgb{255, 0, 0});
  CHECK(f.image.at(bar_x, bottom) == Rgb{255, 255, 255});
  CHECK(f.image.at(f.bar_left + f.bar_width + 1, f.top) == Rgb{0, 0, 0});
}
