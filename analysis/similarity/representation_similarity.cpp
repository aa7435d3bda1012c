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

// Song et al.'s unbiased HSIC of the Gram matrices K = XXᵀ and L = YYᵀ with their diagonals
// zeroed,
//   (tr(KL) + 1ᵀK1·1ᵀL1 / ((n−1)(n−2)) − 2·1ᵀKL1 / (n−2)) / (n(n−3)),
// computed in feature space, O(n·p·q) time and never an n × n matrix: a language model's
// logits have a row per token, and n² doubles of 10⁵ tokens do not fit in memory.
//   tr(KL) = Σ_{i≠j} (xᵢ·xⱼ)(yᵢ·yⱼ) = ‖XᵀY‖²_F − Σᵢ ‖xᵢ‖²‖yᵢ‖²
//   (K1)ᵢ  = xᵢ·Σⱼxⱼ − ‖xᵢ‖²,  and the same for L.
// Per row i of m: ‖mᵢ‖² (the diagonal of m mᵀ) and (K1)ᵢ for K = m mᵀ without its diagonal.
struct GramRows {
  std::vector<double> squared_norm, row_sum;
};
GramRows gram_rows(const Matrix64& m) {
  std::vector<double> column_sum(size_t(m.cols), 0.0);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t c = 0; c < m.cols; ++c) column_sum[size_t(c)] += m(i, c);
  GramRows g{std::vector<double>(size_t(m.rows)), std::vector<double>(size_t(m.rows))};
  for (int64_t i = 0; i < m.rows; ++i) {
    double dot = 0, square = 0;
    for (int64_t c = 0; c < m.cols; ++c) dot += m(i, c) * column_sum[size_t(c)], square += m(i, c) * m(i, c);
    g.squared_norm[size_t(i)] = square;
    g.row_sum[size_t(i)] = dot - square;
  }
  return g;
}

double unbiased_hsic(const Matrix64& x, const Matrix64& y) {
  const int64_t n = x.rows;
  const GramRows gx = gram_rows(x), gy = gram_rows(y);
  const Matrix64 xty = matmul(x, y, true, false);
  double trace_kl = frobenius_inner(xty, xty), sum_k = 0, sum_l = 0, kl_ones = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    trace_kl -= gx.squared_norm[i] * gy.squared_norm[i];
    sum_k += gx.row_sum[i], sum_l += gy.row_sum[i], kl_ones += gx.row_sum[i] * gy.row_sum[i];
  }
  const double nd = double(n);
  return (trace_kl + sum_k * sum_l / ((nd - 1) * (nd - 2)) - 2 * kl_ones / (nd - 2)) / (nd * (nd - 3));
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
  return unbiased_hsic(x, y) / std::sqrt(unbiased_hsic(x, x) * unbiased_hsic(y, y));
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
