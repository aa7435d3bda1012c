// The identity metric at any depth (analysis/similarity/network_tensor.h) against the networks'
// tensors built explicitly here, entry by entry, on networks small enough to hold them (each
// tensor checked to evaluate to the network first), and against the one-layer closed form.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/network_tensor.h"
#include "analysis/similarity/tensor_similarity.h"
#include "engine/error.h"
#include "engine/random.h"
#include "models/model.h"

using namespace adjoint;

namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, double std = 0.7) {
  std::normal_distribution<float> normal(0.0f, float(std));
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return Tensor::from_vector(shape, v);
}

PolynomialStep linear(int64_t in, int64_t out, bool bias, std::mt19937& rng) {
  PolynomialStep s;
  s.kind = PolynomialStep::Kind::Linear, s.name = "linear";
  s.weight = random_tensor({out, in}, rng);
  if (bias) s.bias = random_tensor({out}, rng);
  return s;
}

PolynomialStep bilinear(int64_t width, int64_t hidden, bool residual, std::mt19937& rng) {
  PolynomialStep s;
  s.kind = PolynomialStep::Kind::Bilinear, s.name = "mlp";
  s.left = random_tensor({hidden, width + 1}, rng), s.right = random_tensor({hidden, width + 1}, rng);
  s.down = random_tensor({width, hidden}, rng);
  s.residual = residual, s.scale = residual ? 0.5 : 1.0;
  return s;
}

PolynomialStep attention(int64_t dim, int64_t heads, std::mt19937& rng) {
  PolynomialStep s;
  s.kind = PolynomialStep::Kind::Attention, s.name = "attention";
  s.qkv = random_tensor({5 * dim, dim}, rng), s.proj = random_tensor({dim, dim}, rng);
  s.heads = heads, s.residual = true, s.scale = 0.5;
  return s;
}

// A residual bilinear MLP: embedding, `depth` blocks, head.
PolynomialView mlp(int64_t inputs, int64_t width, int depth, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  PolynomialView v;
  v.arch = "mlp", v.input_dim = inputs;
  v.steps.push_back(linear(inputs, width, true, rng));
  for (int k = 0; k < depth; ++k) v.steps.push_back(bilinear(width, 3, true, rng));
  v.steps.push_back(linear(width, 2, true, rng));
  return v;
}

// A bilinear-attention LM: embedding, `blocks` × (attention, optionally an MLP), head.
PolynomialView lm(int64_t positions, int64_t tokens, int64_t dim, int blocks, bool with_mlp, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  PolynomialView v;
  v.arch = "lm", v.input_dim = tokens, v.positions = positions;
  v.steps.push_back(linear(tokens, dim, false, rng));
  for (int k = 0; k < blocks; ++k) {
    v.steps.push_back(attention(dim, 2, rng));
    if (with_mlp) v.steps.push_back(bilinear(dim, 3, true, rng));
  }
  v.steps.push_back(linear(dim, 2, false, rng));
  return v;
}

// An explicit tensor over the padded input x̃ (n coordinates), of some order, row-major.
using Explicit = std::vector<double>;

Explicit outer(const Explicit& p, const Explicit& q) {
  Explicit out(p.size() * q.size());
  for (size_t i = 0; i < p.size(); ++i)
    for (size_t j = 0; j < q.size(); ++j) out[i * q.size() + j] = p[i] * q[j];
  return out;
}
Explicit outer(const std::vector<const Explicit*>& parts) {
  Explicit out = {1.0};
  for (const Explicit* p : parts) out = outer(out, *p);
  return out;
}
void add(Explicit& dst, const Explicit& src, double alpha) {
  if (dst.empty()) dst.assign(src.size(), 0.0);
  for (size_t i = 0; i < src.size(); ++i) dst[i] += alpha * src[i];
}
double dot(const Explicit& p, const Explicit& q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += p[i] * q[i];
  return s;
}

// Σ_c w[c]·state[c]: a leg applied to the state, as a tensor.
Explicit leg(const std::vector<Explicit>& state, const std::vector<double>& w) {
  Explicit out;
  for (size_t c = 0; c < w.size(); ++c)
    if (w[c] != 0) add(out, state[c], w[c]);
  if (out.empty()) out.assign(state[0].size(), 0.0);
  return out;
}

// The state's coordinates as tensors, step by step, each layer symmetrised over its legs' symmetry.
std::vector<Explicit> explicit_tensors(const PolynomialView& v) {
  const int64_t T = v.positions;
  int64_t width = v.input_dim;
  const int64_t n = 1 + T * width;
  std::vector<Explicit> state(size_t(n), Explicit(size_t(n), 0.0));
  for (int64_t c = 0; c < n; ++c) state[size_t(c)][size_t(c)] = 1;
  auto at = [](int64_t w, int64_t t, int64_t i) { return size_t(1 + t * w + i); };
  for (const PolynomialStep& s : v.steps) {
    const size_t N = state.size();
    const Explicit e0 = state[0];
    std::vector<Explicit> next;
    if (s.kind == PolynomialStep::Kind::Linear) {
      const Matrix64 w = to_matrix64(s.weight);
      const Matrix64 b = s.bias.defined() ? to_matrix64(s.bias) : Matrix64();
      next.assign(size_t(1 + T * w.rows), Explicit());
      next[0] = e0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < w.rows; ++o) {
          std::vector<double> coef(N, 0.0);
          if (b.rows) coef[0] = b(0, o);
          for (int64_t i = 0; i < width; ++i) coef[at(width, t, i)] = w(o, i);
          next[at(w.rows, t, o)] = leg(state, coef);
        }
      width = w.rows;
    } else if (s.kind == PolynomialStep::Kind::Bilinear) {
      const Matrix64 l = to_matrix64(s.left), r = to_matrix64(s.right), d = to_matrix64(s.down);
      next.assign(size_t(1 + T * d.rows), Explicit());
      next[0] = outer(e0, e0);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < l.rows; ++h) {
          std::vector<double> lc(N, 0.0), rc(N, 0.0);
          lc[0] = l(h, 0), rc[0] = r(h, 0);
          for (int64_t i = 0; i < width; ++i) lc[at(width, t, i)] = l(h, 1 + i), rc[at(width, t, i)] = r(h, 1 + i);
          const Explicit A = leg(state, lc), B = leg(state, rc);
          const Explicit sym = [&] { Explicit x = outer(A, B); add(x, outer(B, A), 1.0); for (double& y : x) y *= 0.5; return x; }();
          for (int64_t o = 0; o < d.rows; ++o) add(next[at(d.rows, t, o)], sym, s.scale * d(o, h));
        }
        if (s.residual)
          for (int64_t i = 0; i < width; ++i) {
            const Explicit& h = state[at(width, t, i)];
            add(next[at(width, t, i)], outer(h, e0), 0.5), add(next[at(width, t, i)], outer(e0, h), 0.5);
          }
      }
    } else {
      const Matrix64 qkv = to_matrix64(s.qkv), proj = to_matrix64(s.proj);
      const int64_t dim = width, dh = dim / s.heads;
      const double coef = s.scale / double(dh * dh);
      auto part = [&](int p, int64_t t, int64_t row) {
        std::vector<double> c(N, 0.0);
        for (int64_t i = 0; i < dim; ++i) c[at(dim, t, i)] = qkv(p * dim + row, i);
        return leg(state, c);
      };
      next.assign(N, Explicit());
      next[0] = outer({&e0, &e0, &e0, &e0, &e0});
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < dim; ++j) next[at(dim, t, j)] = outer({&state[at(dim, t, j)], &e0, &e0, &e0, &e0});
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t head = 0; head < s.heads; ++head)
            for (int64_t i = 0; i < dh; ++i)
              for (int64_t i2 = 0; i2 < dh; ++i2) {
                const Explicit q1 = part(0, t, head * dh + i), k1 = part(1, u, head * dh + i);
                const Explicit q2 = part(2, t, head * dh + i2), k2 = part(3, u, head * dh + i2);
                for (int64_t jv = 0; jv < dh; ++jv) {
                  const Explicit val = part(4, u, head * dh + jv);
                  Explicit term = outer({&val, &k1, &k2, &q1, &q2});
                  add(term, outer({&val, &k2, &k1, &q2, &q1}), 1.0);
                  for (int64_t j = 0; j < dim; ++j) add(next[at(dim, t, j)], term, 0.5 * coef * proj(j, head * dh + jv));
                }
              }
      }
    }
    state = std::move(next);
  }
  return state;
}

// The tensor evaluated on x̃^{⊗order}: the polynomial it stands for, at x.
double evaluate_tensor(const Explicit& tensor, const std::vector<double>& padded) {
  std::vector<double> power = {1.0};
  while (power.size() < tensor.size()) power = outer(power, padded);
  return dot(tensor, power);
}

void check_against_explicit(const PolynomialView& a, const PolynomialView& b) {
  const std::vector<Explicit> ta = explicit_tensors(a), tb = explicit_tensors(b);
  // The explicit tensors are the networks: evaluated on x̃ they give the polynomial's outputs.
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  std::vector<double> x(static_cast<size_t>(a.positions * a.input_dim));
  for (double& v : x) v = normal(rng);
  std::vector<double> padded = {1.0};
  padded.insert(padded.end(), x.begin(), x.end());
  const std::vector<double> fa = evaluate_polynomial(a, x, 1);
  for (size_t k = 0; k < fa.size(); ++k) CHECK(evaluate_tensor(ta[1 + k], padded) == doctest::Approx(fa[k]).epsilon(1e-9));
  // The Gram recursion's last matrix against the explicit inner products, entry by entry.
  const Matrix64 g = network_tensor_grams(a, b).back();
  REQUIRE(g.rows == int64_t(ta.size()));
  REQUIRE(g.cols == int64_t(tb.size()));
  double largest = 0, worst = 0;
  for (size_t i = 0; i < ta.size(); ++i)
    for (size_t j = 0; j < tb.size(); ++j) largest = std::max(largest, std::abs(dot(ta[i], tb[j])));
  for (size_t i = 0; i < ta.size(); ++i)
    for (size_t j = 0; j < tb.size(); ++j) worst = std::max(worst, std::abs(g(int64_t(i), int64_t(j)) - dot(ta[i], tb[j])));
  CHECK(largest > 0);
  CHECK(worst <= 1e-12 * largest);
  // The scaled route gives the same diagonal.
  const NetworkTensorInner inner = network_tensor_inner(a, b);
  for (size_t k = 0; k < inner.value.size(); ++k)
    CHECK(inner.value[k] * std::exp(inner.log_scale) == doctest::Approx(dot(ta[1 + k], tb[1 + k])).epsilon(1e-12));
}

}  // namespace

TEST_CASE("network tensor: the Gram recursion equals the explicit tensors' inner products") {
  SUBCASE("residual bilinear MLPs of depth 2 and 3, different seeds") {
    check_against_explicit(mlp(2, 2, 2, 1), mlp(2, 2, 2, 2));
    check_against_explicit(mlp(2, 2, 3, 3), mlp(2, 2, 3, 4));
  }
  SUBCASE("one attention block (attention, MLP) over 2 positions") {
    check_against_explicit(lm(2, 1, 4, 1, true, 5), lm(2, 1, 4, 1, true, 6));
  }
  SUBCASE("attention only, 3 positions") { check_against_explicit(lm(3, 1, 4, 1, false, 7), lm(3, 1, 4, 1, false, 8)); }
}

TEST_CASE("network tensor: one bilinear layer is the closed form's identity metric") {
  for (int64_t depth : {0, 1}) {
    CAPTURE(depth);
    ModelConfig c;
    c.arch = "bilinear_mlp", c.in_features = 5, c.hidden = 6, c.num_classes = 3, c.depth = depth, c.dim = 4;
    Generator ga(11), gb(12);
    const PolynomialView va = make_model(c, ga)->polynomial_view(), vb = make_model(c, gb)->polynomial_view();
    const SimilarityMetric& identity = similarity_metric("identity");
    const Similarity closed = tensor_similarity(identity, bilinear_form(va), bilinear_form(vb), true);
    const NetworkTensorInner ab = network_tensor_inner(va, vb), aa = network_tensor_inner(va, va),
                             bb = network_tensor_inner(vb, vb);
    for (size_t o = 0; o < ab.value.size(); ++o) {
      CHECK(ab.value[o] * std::exp(ab.log_scale) == doctest::Approx(closed.slice_ab[o]).epsilon(1e-12));
      CHECK(aa.value[o] * std::exp(aa.log_scale) == doctest::Approx(closed.slice_aa[o]).epsilon(1e-12));
    }
    CHECK(std::abs(closed.inner_ab) > 0);
  }
}

TEST_CASE("network tensor: a deep stack's numbers overflow, its cosine does not") {
  PolynomialView a = mlp(3, 3, 12, 21), b = mlp(3, 3, 12, 22);
  for (PolynomialView* v : {&a, &b})
    for (PolynomialStep& s : v->steps)
      if (s.kind == PolynomialStep::Kind::Bilinear) s.scale = 4.0;
  const Matrix64 raw = network_tensor_grams(a, b).back();
  CHECK_FALSE(std::isfinite(raw(1, 1)));  // without the log scale, out of range
  const NetworkTensorInner ab = network_tensor_inner(a, b), aa = network_tensor_inner(a, a), bb = network_tensor_inner(b, b);
  CHECK(ab.log_scale > 709);  // e^709: the largest double
  double sab = 0, saa = 0, sbb = 0;
  for (size_t k = 0; k < ab.value.size(); ++k) sab += ab.value[k], saa += aa.value[k], sbb += bb.value[k];
  const double cosine = sab * std::exp(ab.log_scale - 0.5 * (aa.log_scale + bb.log_scale)) / std::sqrt(saa * sbb);
  CHECK(std::isfinite(cosine));
  CHECK(std::abs(cosine) <= 1.0 + 1e-12);
  const NetworkTensorInner self = network_tensor_inner(a, a);
  double s = 0;
  for (double v : self.value) s += v;
  CHECK(s * std::exp(self.log_scale - aa.log_scale) / saa == doctest::Approx(1.0));
}

TEST_CASE("network tensor: networks of different kinds are refused by name") {
  CHECK_THROWS_WITH_AS(network_tensor_inner(mlp(2, 2, 2, 1), mlp(2, 2, 3, 1)), doctest::Contains("steps"), Error);
  CHECK_THROWS_WITH_AS(network_tensor_inner(mlp(2, 2, 2, 1), mlp(3, 2, 2, 1)), doctest::Contains("input or output"), Error);
}

TEST_CASE("tensor similarity of deep models under the identity metric: the network tensors' route") {
  ModelConfig c;
  c.arch = "bilinear_mlp", c.in_features = 6, c.hidden = 5, c.num_classes = 3, c.depth = 3, c.dim = 4;
  Generator ga(31), gb(32), gr(33);
  const auto a = make_model(c, ga), b = make_model(c, gb), r = make_model(c, gr);
  TensorSimOptions o;
  o.metric = "identity";
  const TensorSimScore s = tensor_similarity(*a, *b, o);
  CHECK(s.kind == "exact");
  CHECK(s.method.find("identity metric") != std::string::npos);
  const PolynomialView va = a->polynomial_view(), vb = b->polynomial_view(), vr = r->polynomial_view();
  const NetworkTensorInner ab = network_tensor_inner(va, vb), aa = network_tensor_inner(va, va), bb = network_tensor_inner(vb, vb);
  auto total = [](const NetworkTensorInner& x) {
    double t = 0;
    for (double v : x.value) t += v;
    return t * std::exp(x.log_scale);
  };
  CHECK(s.total == doctest::Approx(total(ab) / std::sqrt(total(aa) * total(bb))).epsilon(1e-12));
  CHECK(std::abs(s.total) > 1e-3);
  CHECK(s.inner_ab == doctest::Approx(total(ab)).epsilon(1e-12));
  // (A − R) against B, by linearity.
  const TensorSimScore d = tensor_similarity(*a, *b, o, r.get());
  const double dab = total(ab) - total(network_tensor_inner(vr, vb));
  const double daa = total(aa) - 2 * total(network_tensor_inner(va, vr)) + total(network_tensor_inner(vr, vr));
  CHECK(d.total == doctest::Approx(dab / std::sqrt(daa * total(bb))).epsilon(1e-10));
  // Without the constant coordinate there is no tensor of a deep network: refused.
  o.bias = false;
  CHECK_THROWS_AS(tensor_similarity(*a, *b, o), UsageError);
}
