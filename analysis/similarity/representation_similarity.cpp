#include "analysis/similarity/representation_similarity.h"

#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

void check_rows(const Matrix64& x, const Matrix64& y, const char* what) {
  check(x.rows == y.rows, what, ": the two activation matrices cover ", x.rows, " and ", y.rows, " examples");
}

Matrix64 centred_columns(const Matrix64& m) {
  Matrix64 out = m;
  for (int64_t c = 0; c < m.cols; ++c) {
    double mean = 0;
    for (int64_t r = 0; r < m.rows; ++r) mean += m(r, c);
    mean /= double(m.rows);
    for (int64_t r = 0; r < m.rows; ++r) out(r, c) -= mean;
  }
  return out;
}

double frobenius_norm(const Matrix64& m) { return std::sqrt(frobenius_inner(m, m)); }

// Song et al.'s unbiased HSIC of two Gram matrices with their diagonals already zeroed.
double unbiased_hsic(const Matrix64& k, const Matrix64& l) {
  const double n = double(k.rows);
  double trace_kl = 0, sum_k = 0, sum_l = 0, kl_ones = 0;
  std::vector<double> k1(size_t(k.rows), 0.0), l1(size_t(l.rows), 0.0);
  for (int64_t i = 0; i < k.rows; ++i)
    for (int64_t j = 0; j < k.cols; ++j) {
      trace_kl += k(i, j) * l(j, i);
      k1[size_t(i)] += k(i, j), l1[size_t(i)] += l(i, j);
    }
  for (size_t i = 0; i < k1.size(); ++i) sum_k += k1[i], sum_l += l1[i], kl_ones += k1[i] * l1[i];
  return (trace_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2 * kl_ones / (n - 2)) / (n * (n - 3));
}

Matrix64 gram_without_diagonal(const Matrix64& x) {
  Matrix64 g = matmul(x, x, false, true);
  for (int64_t i = 0; i < g.rows; ++i) g(i, i) = 0;
  return g;
}

}  // namespace

double linear_cka(const Matrix64& x, const Matrix64& y) {
  check_rows(x, y, "linear CKA");
  const Matrix64 xc = centred_columns(x), yc = centred_columns(y);
  const double cross = frobenius_norm(matmul(yc, xc, true, false));
  return cross * cross / (frobenius_norm(matmul(xc, xc, true, false)) * frobenius_norm(matmul(yc, yc, true, false)));
}

double linear_cka_debiased(const Matrix64& x, const Matrix64& y) {
  check_rows(x, y, "debiased linear CKA");
  check(x.rows >= 4, "debiased linear CKA needs at least 4 examples, got ", x.rows);
  const Matrix64 k = gram_without_diagonal(x), l = gram_without_diagonal(y);
  return unbiased_hsic(k, l) / std::sqrt(unbiased_hsic(k, k) * unbiased_hsic(l, l));
}

double prediction_agreement(const Matrix64& a, const Matrix64& b) {
  check(a.rows == b.rows && a.cols == b.cols, "prediction agreement: logits of ", a.rows, "×", a.cols, " and ", b.rows,
        "×", b.cols);
  auto argmax = [](const Matrix64& m, int64_t r) {
    int64_t best = 0;
    for (int64_t c = 1; c < m.cols; ++c)
      if (m(r, c) > m(r, best)) best = c;
    return best;
  };
  int64_t same = 0;
  for (int64_t r = 0; r < a.rows; ++r) same += argmax(a, r) == argmax(b, r);
  return a.rows ? double(same) / double(a.rows) : 0.0;
}

double output_correlation(const Matrix64& a, const Matrix64& b) {
  check(a.data.size() == b.data.size(), "output correlation: ", a.data.size(), " and ", b.data.size(), " logits");
  const double n = double(a.data.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.data.size(); ++i) ma += a.data[i] / n, mb += b.data[i] / n;
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    const double da = a.data[i] - ma, db = b.data[i] - mb;
    ab += da * db, aa += da * da, bb += db * db;
  }
  return ab / std::sqrt(aa * bb);
}

double weight_cosine(const Module& a, const Module& b) {
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  check(pa.size() == pb.size(), "weight cosine: the models have ", pa.size(), " and ", pb.size(), " parameters");
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    check(pa[i].first == pb[i].first && pa[i].second.shape() == pb[i].second.shape(), "weight cosine: parameter ",
          pa[i].first, " ", pa[i].second.shape(), " meets ", pb[i].first, " ", pb[i].second.shape());
    const std::vector<float> va = pa[i].second.to_vector(), vb = pb[i].second.to_vector();
    for (size_t j = 0; j < va.size(); ++j) ab += double(va[j]) * vb[j], aa += double(va[j]) * va[j], bb += double(vb[j]) * vb[j];
  }
  return ab / std::sqrt(aa * bb);
}

}  // namespace adjoint
