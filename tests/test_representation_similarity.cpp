// The baselines beside tensor similarity (analysis/similarity/representation_similarity.h), against
// values computed with numpy from the definitions (the script is in each comment).
#include <doctest/doctest.h>

#include <cmath>

#include "analysis/similarity/representation_similarity.h"
#include "engine/error.h"
#include "engine/random.h"
#include "models/model.h"

using namespace adjoint;

namespace {

Matrix64 matrix(int64_t rows, int64_t cols, std::vector<double> values) {
  Matrix64 m(rows, cols);
  m.data = std::move(values);
  return m;
}

// X = [[1,2],[0,1],[3,-1],[2,2],[-1,0],[4,1]], Y = [[0,1,2],[1,1,0],[2,-1,1],[0,3,1],[1,0,0],[2,2,-2]].
const Matrix64 kX = matrix(6, 2, {1, 2, 0, 1, 3, -1, 2, 2, -1, 0, 4, 1});
const Matrix64 kY = matrix(6, 3, {0, 1, 2, 1, 1, 0, 2, -1, 1, 0, 3, 1, 1, 0, 0, 2, 2, -2});

}  // namespace

TEST_CASE("representation similarity: linear CKA, biased and debiased, against numpy") {
  // numpy: X -= X.mean(0); Y -= Y.mean(0); norm(Y.T@X)**2 / (norm(X.T@X) * norm(Y.T@Y))
  CHECK(linear_cka(kX, kY) == doctest::Approx(0.35477741791172135).epsilon(1e-12));
  // numpy: K = X@X.T, L = Y@Y.T, diagonals zeroed, hsic_u(K, L) =
  //   (tr(KL) + 1ᵀK1·1ᵀL1/((n-1)(n-2)) − 2/(n-2)·1ᵀKL1) / (n(n-3)); cka = hsic_u(K,L)/sqrt(hsic_u(K,K)·hsic_u(L,L))
  CHECK(linear_cka_debiased(kX, kY) == doctest::Approx(-0.1056539081823157).epsilon(1e-12));
  // Invariances: CKA of a representation with an orthogonal rotation and scaling of itself is 1.
  Matrix64 rotated(6, 2);
  for (int64_t r = 0; r < 6; ++r) rotated(r, 0) = 3 * kX(r, 1), rotated(r, 1) = -3 * kX(r, 0);
  CHECK(linear_cka(kX, rotated) == doctest::Approx(1.0).epsilon(1e-12));
  CHECK(linear_cka_debiased(kX, rotated) == doctest::Approx(1.0).epsilon(1e-12));
  CHECK_THROWS_WITH_AS(linear_cka(kX, matrix(2, 1, {1, 2})), doctest::Contains("cover 6 and 2 examples"), Error);
}

TEST_CASE("representation similarity: debiased CKA equals its Gram-matrix definition, and needs no n × n memory") {
  // The definition with explicit Gram matrices, in plain loops, on random data.
  Generator gen(5);
  const int64_t n = 37;
  const auto random_matrix = [&](int64_t rows, int64_t cols) {
    Matrix64 m(rows, cols);
    const std::vector<float> v = normal({rows, cols}, 0.0f, 1.0f, gen).to_vector();
    m.data.assign(v.begin(), v.end());
    return m;
  };
  const Matrix64 x = random_matrix(n, 4);
  Matrix64 y = random_matrix(n, 6);
  for (int64_t i = 0; i < n; ++i) y(i, 0) += x(i, 0), y(i, 1) -= x(i, 2);  // related, so CKA is not ~0
  const auto gram = [&](const Matrix64& m) {
    Matrix64 g(n, n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < m.cols && i != j; ++c) g(i, j) += m(i, c) * m(j, c);
    return g;
  };
  const auto hsic = [&](const Matrix64& k, const Matrix64& l) {
    double kl = 0, sk = 0, sl = 0, k1l1 = 0;
    for (int64_t i = 0; i < n; ++i) {
      double ki = 0, li = 0;
      for (int64_t j = 0; j < n; ++j) kl += k(i, j) * l(j, i), ki += k(i, j), li += l(i, j);
      sk += ki, sl += li, k1l1 += ki * li;
    }
    const double nd = double(n);
    return (kl + sk * sl / ((nd - 1) * (nd - 2)) - 2 * k1l1 / (nd - 2)) / (nd * (nd - 3));
  };
  const Matrix64 k = gram(x), l = gram(y);
  const double by_definition = hsic(k, l) / std::sqrt(hsic(k, k) * hsic(l, l));
  CHECK(std::abs(by_definition) > 0.05);
  CHECK(linear_cka_debiased(x, y) == doctest::Approx(by_definition).epsilon(1e-10));

  // A language model's logits: a row per token. 3·10⁵ rows would be 720 GB of Gram matrix.
  const Matrix64 tokens_a = random_matrix(300000, 3);
  Matrix64 tokens_b = random_matrix(300000, 2);
  for (int64_t i = 0; i < tokens_b.rows; ++i) tokens_b(i, 0) += tokens_a(i, 0);
  const double cka = linear_cka_debiased(tokens_a, tokens_b);
  CHECK(cka > 0.1);
  CHECK(cka < 1.0);
}

TEST_CASE("representation similarity: agreement, output correlation and weight cosine") {
  const Matrix64 a = matrix(4, 3, {1, 2, 0, 3, 1, 2, 0, 0, 1, 1, 5, 2});
  const Matrix64 b = matrix(4, 3, {2, 1, 0, 3, 4, 2, 1, 0, 0.5, 0, 5, 2});
  // arg-max per row: a 1, 0, 2, 1; b 0, 1, 0, 1: only the last row agrees.
  CHECK(prediction_agreement(a, b) == doctest::Approx(0.25));
  // numpy: np.corrcoef(a.ravel(), b.ravel())[0, 1]
  CHECK(output_correlation(a, b) == doctest::Approx(0.7617193096357989).epsilon(1e-12));

  ModelConfig c;
  c.arch = "bilinear_mlp", c.num_classes = 3, c.in_channels = 1, c.image_size = 2, c.hidden = 4;
  Generator g1(1), g2(2);
  auto m1 = make_model(c, g1), m2 = make_model(c, g2);
  CHECK(weight_cosine(*m1, *m1) == doctest::Approx(1.0).epsilon(1e-12));
  double ab = 0, aa = 0, bb = 0;
  for (const auto& name : {"bilinear.left", "bilinear.right", "head.weight"}) {
    const auto x = m1->state_dict().at(name).to_vector(), y = m2->state_dict().at(name).to_vector();
    for (size_t i = 0; i < x.size(); ++i) ab += double(x[i]) * y[i], aa += double(x[i]) * x[i], bb += double(y[i]) * y[i];
  }
  CHECK(weight_cosine(*m1, *m2) == doctest::Approx(ab / std::sqrt(aa * bb)).epsilon(1e-12));
  c.hidden = 5;
  auto m3 = make_model(c, g2);
  CHECK_THROWS_WITH_AS(weight_cosine(*m1, *m3), doctest::Contains("parameter bilinear.left [4, 5] meets bilinear.left [5, 5]"),
                       Error);
}
