#include "analysis/similarity/polynomial_moments.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <tuple>

#include "analysis/similarity/canonical_pairing.h"
#include "engine/error.h"

namespace adjoint {

namespace {

// ---- Dense polynomials, recursively laid out -------------------------------------------
//
// A polynomial in m variables of degree ≤ d is the blocks k = 0..d of the powers y_0^k, each
// block a polynomial in the m − 1 later variables of degree ≤ d − k. It holds
// S(m, d) = C(m + d, d) coefficients, and block k starts at S(m, d) − S(m, d − k) (the
// blocks before it hold Σ_{j > d−k} S(m−1, j) of them).

double terms(int64_t m, int64_t d) {  // C(m + d, d), in double: the cost model reads huge ones
  if (d < 0) return 0;
  double s = 1;
  for (int64_t i = 1; i <= d; ++i) s = s * double(m + i) / double(i);
  return std::round(s);
}

// The same, exact and tabled, for the layouts actually built.
class Sizes {
public:
  Sizes(int64_t variables, int degree) : degree_(degree), table_(size_t((variables + 1) * (degree + 1))) {
    check(terms(variables, degree) < double(int64_t(1) << 40), "polynomial moments: ", terms(variables, degree),
          " coefficients (", variables, " variables, degree ", degree, ") are too many to hold");
    for (int64_t m = 0; m <= variables; ++m)
      for (int d = 0; d <= degree; ++d)
        table_[index(m, d)] = (m == 0 || d == 0) ? 1 : at(m - 1, d) + at(m, d - 1);
  }
  int64_t at(int64_t m, int d) const { return d < 0 ? 0 : table_[index(m, d)]; }
  int64_t block(int64_t m, int d, int k) const { return at(m, d) - at(m, d - k); }

private:
  size_t index(int64_t m, int d) const { return size_t(m * (degree_ + 1) + d); }
  int degree_;
  std::vector<int64_t> table_;
};

const Sizes& sizes_for(int64_t variables, int degree) {
  // One table per thread, grown on demand: every polynomial of one computation shares it.
  thread_local std::deque<std::pair<std::pair<int64_t, int>, Sizes>> cache;  // a deque: references stay valid
  for (auto& [key, s] : cache)
    if (key.first == variables && key.second >= degree) return s;
  cache.emplace_back(std::make_pair(variables, degree), Sizes(variables, degree));
  return cache.back().second;
}

bool all_zero(const double* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (p[i] != 0.0) return false;
  return true;
}

// dst (degree ≤ cd) += alpha · src (degree ≤ cs); where cs > cd, the monomials of src above
// degree cd are left out (a truncation: what an inner product with a polynomial of degree cd reads).
void add_into(const Sizes& S, double* dst, int cd, const double* src, int cs, int64_t m, double alpha) {
  if (cd == cs) {  // the same layout: one pass
    const int64_t n = S.at(m, cd);
    for (int64_t i = 0; i < n; ++i) dst[i] += alpha * src[i];
    return;
  }
  if (m == 0) {
    dst[0] += alpha * src[0];
    return;
  }
  const int top = std::min(cs, cd);
  if (m == 1) {
    for (int k = 0; k <= top; ++k) dst[k] += alpha * src[k];
    return;
  }
  for (int k = 0; k <= top; ++k)
    add_into(S, dst + S.block(m, cd, k), cd - k, src + S.block(m, cs, k), cs - k, m - 1, alpha);
}

// out (degree ≤ co, co ≥ cp + cq) += alpha · p · q. Zero blocks of p and q are skipped: a
// network's early states touch few variables. Two variables are the base case: the
// recursion's calls would cost more than their work below it.
void multiply_into(const Sizes& S, double* out, int co, const double* p, int cp, const double* q, int cq, int64_t m,
                   double alpha) {
  if (m == 0) {
    out[0] += alpha * p[0] * q[0];
    return;
  }
  if (m == 1) {
    for (int i = 0; i <= cp; ++i) {
      const double a = alpha * p[i];
      if (a != 0.0)
        for (int j = 0; j <= cq; ++j) out[i + j] += a * q[j];
    }
    return;
  }
  if (m == 2) {  // blocks i of p hold the powers 0..cp−i of the last variable
    for (int i = 0; i <= cp; ++i) {
      const double* pi = p + S.block(2, cp, i);
      for (int a = 0; a <= cp - i; ++a) {
        const double pa = alpha * pi[a];
        if (pa == 0.0) continue;
        for (int j = 0; j <= cq; ++j) {
          const double* qj = q + S.block(2, cq, j);
          double* o = out + S.block(2, co, i + j) + a;
          for (int b = 0; b <= cq - j; ++b) o[b] += pa * qj[b];
        }
      }
    }
    return;
  }
  // Only blocks worth a scan are tested for zeros: below that, the scans cost more than they save.
  auto worth_skipping = [&](const double* block, int64_t size) { return size >= 64 && all_zero(block, size); };
  check(cq < 64, "polynomial moments: degree ", cq, " is over 63");
  bool q_live[64];
  for (int j = 0; j <= cq; ++j) q_live[j] = !worth_skipping(q + S.block(m, cq, j), S.at(m - 1, cq - j));
  for (int i = 0; i <= cp; ++i) {
    const double* pi = p + S.block(m, cp, i);
    if (worth_skipping(pi, S.at(m - 1, cp - i))) continue;
    for (int j = 0; j <= cq; ++j)
      if (q_live[j])
        multiply_into(S, out + S.block(m, co, i + j), co - i - j, pi, cp - i, q + S.block(m, cq, j), cq - j, m - 1,
                      alpha);
  }
}

// The exponent vectors of every monomial of a layout, in its order (`variables` values each).
void exponents(const Sizes& S, int64_t m, int c, std::vector<uint8_t>& prefix, std::vector<uint8_t>& out) {
  if (m == 0) {
    out.insert(out.end(), prefix.begin(), prefix.end());
    return;
  }
  for (int k = 0; k <= c; ++k) {
    prefix.push_back(uint8_t(k));
    exponents(S, m - 1, c - k, prefix, out);
    prefix.pop_back();
  }
}

// Where the monomial y^α sits in the layout of degree ≤ c.
int64_t position_of(const Sizes& S, const uint8_t* alpha, int64_t variables, int c) {
  int64_t at = 0;
  for (int64_t v = 0; v < variables; ++v) {
    at += S.block(variables - v, c, alpha[v]);
    c -= alpha[v];
  }
  return at;
}

// For products of many pairs of polynomials of the same degrees: where the product of the
// i-th monomial of p and the j-th of q lands, index[i·|q| + j]. Built once (n times the work
// of one product), it turns each product into one pass over the pairs of coefficients,
// where the recursive kernel spends its time on calls over tiny blocks.
class ProductTable {
public:
  ProductTable(const Sizes& S, int64_t variables, int cp, int cq, int co) : q_terms_(S.at(variables, cq)) {
    std::vector<uint8_t> prefix, ep, eq;
    exponents(S, variables, cp, prefix, ep);
    exponents(S, variables, cq, prefix, eq);
    const int64_t p_terms = S.at(variables, cp);
    index_.resize(size_t(p_terms * q_terms_));
    std::vector<uint8_t> sum(static_cast<size_t>(variables));
    for (int64_t i = 0; i < p_terms; ++i)
      for (int64_t j = 0; j < q_terms_; ++j) {
        for (int64_t v = 0; v < variables; ++v) sum[size_t(v)] = uint8_t(ep[size_t(i * variables + v)] + eq[size_t(j * variables + v)]);
        index_[size_t(i * q_terms_ + j)] = uint32_t(position_of(S, sum.data(), variables, co));
      }
  }
  void multiply_into(double* out, const double* p, const double* q, double alpha) const {
    const int64_t p_terms = int64_t(index_.size()) / q_terms_;
    for (int64_t i = 0; i < p_terms; ++i) {
      const double a = alpha * p[i];
      if (a == 0.0) continue;
      const uint32_t* row = &index_[size_t(i * q_terms_)];
      for (int64_t j = 0; j < q_terms_; ++j) out[row[j]] += a * q[j];
    }
  }

private:
  int64_t q_terms_;
  std::vector<uint32_t> index_;
};

// The table for one shape of product, kept across computations (a network's expansion, the
// next network's, the next pair's) while the tables held stay under 10⁸ entries (400 MB).
const ProductTable& product_table(const Sizes& S, int64_t variables, int cp, int cq, int co) {
  using Key = std::tuple<int64_t, int, int, int>;
  thread_local std::map<Key, ProductTable> tables;
  thread_local double held = 0;
  const Key key{variables, cp, cq, co};
  auto it = tables.find(key);
  if (it != tables.end()) return it->second;
  const double entries = double(S.at(variables, cp)) * double(S.at(variables, cq));
  if (held + entries > 1e8) tables.clear(), held = 0;
  held += entries;
  return tables.emplace(key, ProductTable(S, variables, cp, cq, co)).first->second;
}

// y^k = Σ_i k!/(2^i i! (k−2i)!) He_{k−2i}(y), applied along every variable: the inner ones
// block by block, then the outer one by mixing blocks (block k feeds the lower blocks k−2i,
// which are wider, so ascending k reads every block before it is written).
void hermite_in_place(const Sizes& S, double* p, int c, int64_t m) {
  if (m == 0) return;
  for (int k = 0; k <= c; ++k) hermite_in_place(S, p + S.block(m, c, k), c - k, m - 1);
  for (int k = 2; k <= c; ++k) {
    double coefficient = 1;  // k! / (2^i i! (k−2i)!), updated as i grows
    for (int i = 1; 2 * i <= k; ++i) {
      coefficient *= double((k - 2 * i + 2) * (k - 2 * i + 1)) / double(2 * i);
      const int j = k - 2 * i;
      add_into(S, p + S.block(m, c, j), c - j, p + S.block(m, c, k), c - k, m - 1, coefficient);
    }
  }
}

// α!·ρ^α for every monomial of the layout, times `factor`: the Hermite basis's squared norms
// (ρ null: all ones), or with ρ the Gaussian inner products E[He_α(a)·He_α(b)] of paired
// variables with correlations ρ (Mehler's formula; canonical_pairing.h). `first`: the index of
// the layout's outermost variable.
void hermite_norms(const Sizes& S, double* w, int c, int64_t m, double factor, const double* rho = nullptr, int64_t first = 0) {
  if (m == 0) {
    w[0] = factor;
    return;
  }
  double weight = 1;
  for (int k = 0; k <= c; ++k) {
    if (k > 0) weight *= k * (rho ? rho[first] : 1.0);
    hermite_norms(S, w + S.block(m, c, k), c - k, m - 1, factor * weight, rho, first + 1);
  }
}

// Rows of coefficients laid out at degree `from`, re-laid out at degree `to` ≥ from.
Matrix64 relayout(const Matrix64& rows, int64_t variables, int from, int to) {
  if (from == to) return rows;
  const Sizes& S = sizes_for(variables, to);
  Matrix64 out(rows.rows, S.at(variables, to));
  for (int64_t r = 0; r < rows.rows; ++r)
    add_into(S, &out.data[size_t(r * out.cols)], to, &rows.data[size_t(r * rows.cols)], from, variables, 1.0);
  return out;
}

double evaluate_at(const Sizes& S, const double* p, int c, int64_t m, const double* y) {
  if (m == 0) return p[0];
  double total = 0, power = 1;
  for (int k = 0; k <= c; ++k, power *= y[0]) total += power * evaluate_at(S, p + S.block(m, c, k), c - k, m - 1, y + 1);
  return total;
}

DensePolynomial zero_polynomial(int64_t variables, int degree) {
  const Sizes& S = sizes_for(variables, degree);
  return {variables, degree, std::vector<double>(size_t(S.at(variables, degree)), 0.0)};
}

// p re-laid out at a higher degree bound.
void widen(DensePolynomial& p, int degree) {
  if (degree <= p.degree) return;
  DensePolynomial wide = zero_polynomial(p.variables, degree);
  add_into(sizes_for(p.variables, degree), wide.coefficients.data(), degree, p.coefficients.data(), p.degree,
           p.variables, 1.0);
  p = std::move(wide);
}

// ---- The network's steps on polynomial states ------------------------------------------
//
// One forward serves two masters: PolynomialOps builds the polynomials, CostOps only tracks
// each coordinate's degree and counts what the products would cost.

struct PolynomialOps {
  using P = DensePolynomial;
  int64_t variables;

  P constant(double c) const { return {variables, 0, {c}}; }
  P variable(int64_t v, double scale) const {
    std::vector<int> powers(size_t(variables), 0);
    powers[size_t(v)] = 1;
    return monomial(variables, powers, scale);
  }
  void add_scaled(P& dst, const P& src, double alpha) const {
    if (alpha == 0.0) return;
    widen(dst, src.degree);
    add_into(sizes_for(variables, dst.degree), dst.coefficients.data(), dst.degree, src.coefficients.data(),
             src.degree, variables, alpha);
  }
  void add_product(P& dst, const P& p, const P& q, double alpha) const {
    if (alpha == 0.0) return;
    widen(dst, p.degree + q.degree);
    const Sizes& S = sizes_for(variables, dst.degree);
    // A table pays for a shape multiplied again and again; one is kept under 5·10⁷ entries.
    const double pairs = double(p.coefficients.size()) * double(q.coefficients.size());
    if (pairs >= 1e4 && pairs <= 5e7) {
      product_table(S, variables, p.degree, q.degree, dst.degree)
          .multiply_into(dst.coefficients.data(), p.coefficients.data(), q.coefficients.data(), alpha);
      return;
    }
    multiply_into(S, dst.coefficients.data(), dst.degree, p.coefficients.data(), p.degree, q.coefficients.data(), q.degree,
                  variables, alpha);
  }
};

struct CostOps {
  using P = int;  // the degree bound
  int64_t variables;
  double multiply_adds = 0;
  P constant(double) const { return 0; }
  P variable(int64_t, double) const { return 1; }
  void add_scaled(P& dst, const P& src, double) const { dst = std::max(dst, src); }
  void add_product(P& dst, const P& p, const P& q, double) {
    multiply_adds += terms(variables, p) * terms(variables, q);
    dst = std::max(dst, p + q);
  }
};

template <class Ops>
using State = std::vector<std::vector<typename Ops::P>>;  // [position][feature]

// bias + Σ_i w[i]·h[i]
template <class Ops>
typename Ops::P affine(Ops& ops, const double* w, const std::vector<typename Ops::P>& h, double bias) {
  typename Ops::P out = ops.constant(bias);
  for (size_t i = 0; i < h.size(); ++i) ops.add_scaled(out, h[i], w[i]);
  return out;
}

template <class Ops>
void linear_step(Ops& ops, const PolynomialStep& s, State<Ops>& h) {
  const Matrix64 W = to_matrix64(s.weight);
  const Matrix64 b = s.bias.defined() ? to_matrix64(s.bias) : Matrix64();  // (1, out) or (T, out)
  for (size_t t = 0; t < h.size(); ++t) {
    std::vector<typename Ops::P> out;
    for (int64_t o = 0; o < W.rows; ++o)
      out.push_back(affine(ops, &W.data[size_t(o * W.cols)], h[t], b.rows == 0 ? 0.0 : b(b.rows == 1 ? 0 : int64_t(t), o)));
    h[t] = std::move(out);
  }
}

template <class Ops>
void bilinear_step(Ops& ops, const PolynomialStep& s, State<Ops>& h) {
  const Matrix64 L = to_matrix64(s.left), R = to_matrix64(s.right);
  const Matrix64 D = s.down.defined() ? to_matrix64(s.down) : Matrix64::identity(L.rows);
  for (auto& ht : h) {
    check(L.cols == int64_t(ht.size()) + 1, "polynomial moments: ", s.name, " reads ", L.cols - 1, " features, the state has ",
          ht.size());
    std::vector<typename Ops::P> out(size_t(D.rows), ops.constant(0.0));
    for (int64_t k = 0; k < L.rows; ++k) {
      const auto l = affine(ops, &L.data[size_t(k * L.cols + 1)], ht, L(k, 0));
      const auto r = affine(ops, &R.data[size_t(k * R.cols + 1)], ht, R(k, 0));
      typename Ops::P y = ops.constant(0.0);
      ops.add_product(y, l, r, 1.0);
      for (int64_t o = 0; o < D.rows; ++o) ops.add_scaled(out[size_t(o)], y, D(o, k));
    }
    if (s.residual) {
      check(out.size() == ht.size(), "polynomial moments: the residual step ", s.name, " changes the width");
      for (size_t o = 0; o < out.size(); ++o) ops.add_scaled(ht[o], out[o], s.scale);
    } else {
      ht = std::move(out);
    }
  }
}

// h_t ← h_t + s·P Σ_{u≤t} (q1_t·k1_u)(q2_t·k2_u)/d_head² · v_u, per head (models/polynomial.h).
template <class Ops>
void attention_step(Ops& ops, const PolynomialStep& s, State<Ops>& h) {
  check(plain_attention(s), "polynomial moments: attention '", s.name, "' has QK biases or rotary positions, which this route does not take");
  const Matrix64 qkv = to_matrix64(s.qkv), proj = to_matrix64(s.proj);
  const int64_t T = int64_t(h.size()), dim = proj.rows, dh = dim / s.heads;
  std::vector<std::vector<typename Ops::P>> parts(static_cast<size_t>(T));  // q1 k1 q2 k2 v, 5·dim per position
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < qkv.rows; ++r) parts[size_t(t)].push_back(affine(ops, &qkv.data[size_t(r * qkv.cols)], h[size_t(t)], 0.0));
  auto at = [&](int64_t t, int64_t part, int64_t head, int64_t j) -> const typename Ops::P& {
    return parts[size_t(t)][size_t(part * dim + head * dh + j)];
  };
  for (int64_t t = 0; t < T; ++t) {
    std::vector<typename Ops::P> o(size_t(dim), ops.constant(0.0));
    for (int64_t head = 0; head < s.heads; ++head)
      for (int64_t u = 0; u <= t; ++u) {
        typename Ops::P s1 = ops.constant(0.0), s2 = ops.constant(0.0), score = ops.constant(0.0);
        for (int64_t j = 0; j < dh; ++j) ops.add_product(s1, at(t, 0, head, j), at(u, 1, head, j), 1.0);
        for (int64_t j = 0; j < dh; ++j) ops.add_product(s2, at(t, 2, head, j), at(u, 3, head, j), 1.0);
        ops.add_product(score, s1, s2, 1.0 / double(dh * dh));
        for (int64_t j = 0; j < dh; ++j) ops.add_product(o[size_t(head * dh + j)], score, at(u, 4, head, j), 1.0);
      }
    for (int64_t r = 0; r < dim; ++r) ops.add_scaled(h[size_t(t)][size_t(r)], affine(ops, &proj.data[size_t(r * dim)], o, 0.0), s.scale);
  }
}

// The view's steps before its head (a last linear step), run on the input x = σ·y, or
// x = σ·Q·y when read through a basis Q (its columns: the variables of a position).
template <class Ops>
State<Ops> state_before_head(Ops& ops, const PolynomialView& v, double input_std, const Matrix64& basis) {
  State<Ops> h(size_t(v.positions));
  const int64_t r = basis.cols;
  for (int64_t t = 0; t < v.positions; ++t)
    for (int64_t i = 0; i < v.input_dim; ++i) {
      if (r == 0) {
        h[size_t(t)].push_back(ops.variable(t * v.input_dim + i, input_std));
        continue;
      }
      typename Ops::P x = ops.constant(0.0);
      for (int64_t j = 0; j < r; ++j) ops.add_scaled(x, ops.variable(t * r + j, input_std), basis(i, j));
      h[size_t(t)].push_back(std::move(x));
    }
  const bool has_head = !v.steps.empty() && v.steps.back().kind == PolynomialStep::Kind::Linear;
  for (size_t i = 0; i + (has_head ? 1 : 0) < v.steps.size(); ++i) {
    const PolynomialStep& s = v.steps[i];
    switch (s.kind) {
      case PolynomialStep::Kind::Linear: linear_step(ops, s, h); break;
      case PolynomialStep::Kind::Bilinear: bilinear_step(ops, s, h); break;
      case PolynomialStep::Kind::Attention: attention_step(ops, s, h); break;
    }
  }
  return h;
}

}  // namespace

DensePolynomial monomial(int64_t variables, const std::vector<int>& powers, double coefficient) {
  check(int64_t(powers.size()) == variables, "polynomial moments: a monomial of ", powers.size(), " powers in ", variables,
        " variables");
  int degree = 0;
  for (int k : powers) degree += k;
  DensePolynomial p = zero_polynomial(variables, degree);
  const Sizes& S = sizes_for(variables, degree);
  int64_t at = 0;
  int left = degree;
  for (int64_t v = 0; v < variables; ++v) {  // descend: block powers[v] of the remaining polynomial
    at += S.block(variables - v, left, powers[size_t(v)]);
    left -= powers[size_t(v)];
  }
  p.coefficients[size_t(at)] = coefficient;
  return p;
}

DensePolynomial product(const DensePolynomial& p, const DensePolynomial& q) {
  check(p.variables == q.variables, "polynomial moments: a product of polynomials in ", p.variables, " and ", q.variables,
        " variables");
  PolynomialOps ops{p.variables};
  DensePolynomial out = ops.constant(0.0);
  ops.add_product(out, p, q, 1.0);
  return out;
}

DensePolynomial sum(const DensePolynomial& p, const DensePolynomial& q) {
  check(p.variables == q.variables, "polynomial moments: a sum of polynomials in ", p.variables, " and ", q.variables,
        " variables");
  PolynomialOps ops{p.variables};
  DensePolynomial out = p;
  ops.add_scaled(out, q, 1.0);
  return out;
}

double evaluate(const DensePolynomial& p, const std::vector<double>& y) {
  check(int64_t(y.size()) == p.variables, "polynomial moments: evaluating ", p.variables, " variables at ", y.size(),
        " values");
  return evaluate_at(sizes_for(p.variables, p.degree), p.coefficients.data(), p.degree, p.variables, y.data());
}

void accumulate(DensePolynomial& dst, const DensePolynomial& src, double alpha) {
  check(dst.variables == src.variables, "polynomial moments: a sum of polynomials in ", dst.variables, " and ",
        src.variables, " variables");
  PolynomialOps{dst.variables}.add_scaled(dst, src, alpha);
}

void accumulate_product(DensePolynomial& dst, const DensePolynomial& p, const DensePolynomial& q, double alpha) {
  check(dst.variables == p.variables && p.variables == q.variables, "polynomial moments: a product of polynomials in ",
        p.variables, " and ", q.variables, " variables added to one in ", dst.variables);
  PolynomialOps{dst.variables}.add_product(dst, p, q, alpha);
}

Matrix64 hermite_gram(const std::vector<DensePolynomial>& a, const std::vector<DensePolynomial>& b,
                      const std::vector<double>& correlation) {
  Matrix64 gram(int64_t(a.size()), int64_t(b.size()));
  if (a.empty() || b.empty()) return gram;
  const int64_t n = a.front().variables;
  int da = 0, db = 0;
  for (const DensePolynomial& p : a) check(p.variables == n, "polynomial moments: a Gram matrix of polynomials in ", n, " and ", p.variables, " variables"), da = std::max(da, p.degree);
  for (const DensePolynomial& p : b) check(p.variables == n, "polynomial moments: a Gram matrix of polynomials in ", n, " and ", p.variables, " variables"), db = std::max(db, p.degree);
  // E[p·q] reads only the monomials both can hold: degree ≤ min(da, db).
  const int c = std::min(da, db);
  const Sizes& S = sizes_for(n, std::max(da, db));
  const int64_t width = S.at(n, c);
  auto rows = [&](const std::vector<DensePolynomial>& ps) {
    Matrix64 r(int64_t(ps.size()), width);
    for (size_t i = 0; i < ps.size(); ++i)
      add_into(S, &r.data[i * size_t(width)], c, ps[i].coefficients.data(), ps[i].degree, n, 1.0);
    return r;
  };
  Matrix64 ra = rows(a);
  const Matrix64 rb = rows(b);
  check(correlation.empty() || int64_t(correlation.size()) == n, "polynomial moments: ", correlation.size(),
        " correlations for polynomials in ", n, " variables");
  std::vector<double> squared_norms(static_cast<size_t>(width));
  hermite_norms(S, squared_norms.data(), c, n, 1.0, correlation.empty() ? nullptr : correlation.data());
  for (int64_t i = 0; i < ra.rows; ++i)
    for (int64_t k = 0; k < width; ++k) ra(i, k) *= squared_norms[size_t(k)];
  return matmul(ra, rb, false, true);
}

std::vector<std::vector<int>> layout_exponents(int64_t variables, int degree) {
  const Sizes& S = sizes_for(variables, degree);
  std::vector<uint8_t> prefix, flat;
  exponents(S, variables, degree, prefix, flat);
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < flat.size(); i += size_t(variables))
    out.emplace_back(flat.begin() + int64_t(i), flat.begin() + int64_t(i) + variables);
  return out;
}

DensePolynomial at_degree(const DensePolynomial& p, int degree) {
  DensePolynomial out = zero_polynomial(p.variables, degree);
  add_into(sizes_for(p.variables, std::max(p.degree, degree)), out.coefficients.data(), degree, p.coefficients.data(),
           p.degree, p.variables, 1.0);
  return out;
}

namespace {

// He_β·He_α = Π_v Σ_k C(β_v, k)·C(α_v, k)·k!·He_{α_v+β_v−2k} (the linearisation of Hermite
// products, variable by variable), as a table: for every α of the layout of degree c, where its
// terms land in the layout of degree c + |β| and with which coefficients.
struct HermiteProductTable {
  std::vector<int64_t> source, target;
  std::vector<double> coefficient;
};

const HermiteProductTable& hermite_product_table(int64_t variables, int c, const std::vector<int>& beta) {
  using Key = std::tuple<int64_t, int, std::vector<int>>;
  thread_local std::map<Key, HermiteProductTable> tables;
  const Key key{variables, c, beta};
  auto it = tables.find(key);
  if (it != tables.end()) return it->second;
  int order = 0;
  for (int b : beta) order += b;
  const int co = c + order;
  const Sizes& S = sizes_for(variables, co);
  std::vector<uint8_t> prefix, flat;
  exponents(S, variables, c, prefix, flat);
  HermiteProductTable table;
  std::vector<uint8_t> gamma(static_cast<size_t>(variables));
  std::vector<int64_t> active;  // the variables β touches
  for (int64_t v = 0; v < variables; ++v)
    if (beta[size_t(v)] > 0) active.push_back(v);
  auto binomial = [](int n, int k) {
    double r = 1;
    for (int i = 1; i <= k; ++i) r = r * (n - k + i) / i;
    return r;
  };
  const int64_t count = int64_t(flat.size()) / std::max<int64_t>(variables, 1);
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* alpha = &flat[size_t(i * variables)];
    // Every choice of k_v ≤ min(α_v, β_v) on the active variables.
    std::vector<int> k(active.size(), 0);
    while (true) {
      double coefficient = 1;
      for (int64_t v = 0; v < variables; ++v) gamma[size_t(v)] = alpha[v];
      for (size_t j = 0; j < active.size(); ++j) {
        const int64_t v = active[j];
        const int a = alpha[v], b = beta[size_t(v)], kj = k[j];
        double factorial = 1;
        for (int f = 2; f <= kj; ++f) factorial *= f;
        coefficient *= binomial(b, kj) * binomial(a, kj) * factorial;
        gamma[size_t(v)] = uint8_t(a + b - 2 * kj);
      }
      table.source.push_back(i);
      table.target.push_back(position_of(S, gamma.data(), variables, co));
      table.coefficient.push_back(coefficient);
      size_t j = 0;  // the next choice, odometer-wise
      for (; j < active.size(); ++j) {
        if (k[j] < std::min<int>(alpha[active[j]], beta[size_t(active[j])])) {
          ++k[j];
          break;
        }
        k[j] = 0;
      }
      if (j == active.size()) break;
    }
  }
  return tables.emplace(key, std::move(table)).first->second;
}

}  // namespace

DensePolynomial hermite_times(const DensePolynomial& p, const std::vector<int>& beta) {
  check(int64_t(beta.size()) == p.variables, "polynomial moments: He_β with ", beta.size(), " exponents times a polynomial in ",
        p.variables, " variables");
  int order = 0;
  for (int b : beta) order += b;
  DensePolynomial out = zero_polynomial(p.variables, p.degree + order);
  const HermiteProductTable& table = hermite_product_table(p.variables, p.degree, beta);
  for (size_t i = 0; i < table.source.size(); ++i)
    out.coefficients[size_t(table.target[i])] += table.coefficient[i] * p.coefficients[size_t(table.source[i])];
  return out;
}

DensePolynomial to_hermite(DensePolynomial p) {
  hermite_in_place(sizes_for(p.variables, p.degree), p.coefficients.data(), p.degree, p.variables);
  return p;
}

double hermite_inner(const DensePolynomial& p, const DensePolynomial& q) {
  check(p.variables == q.variables, "polynomial moments: an inner product of polynomials in ", p.variables, " and ",
        q.variables, " variables");
  // The rows of one position's Gram matrix: the same code as the networks' outputs.
  HermiteExpansion a, b;
  for (auto [e, poly] : {std::make_pair(&a, &p), std::make_pair(&b, &q)}) {
    e->variables = p.variables, e->degree = poly->degree, e->classes = 1;
    e->state.push_back(Matrix64(1, int64_t(poly->coefficients.size())));
    e->state[0].data = poly->coefficients;
    e->head.push_back(Matrix64(1, 1, 1.0));
  }
  return hermite_output_inner(a, b)[0];
}

PolynomialCost polynomial_cost(const PolynomialView& view, int64_t features) {
  CostOps ops{view.positions * (features > 0 ? features : view.input_dim)};
  const State<CostOps> h = state_before_head(ops, view, 1.0, Matrix64(view.input_dim, features));
  PolynomialCost c;
  c.variables = ops.variables;
  for (const auto& ht : h)
    for (int d : ht) {
      c.degree = std::max<int64_t>(c.degree, d);
      c.held += terms(c.variables, d);
    }
  c.multiply_adds = ops.multiply_adds;
  c.largest_terms = terms(c.variables, c.degree);
  return c;
}

Matrix64 shared_input_basis(const std::vector<const PolynomialView*>& views) {
  std::vector<Matrix64> maps;
  const int64_t n = views.empty() ? 0 : views.front()->input_dim;
  for (const PolynomialView* v : views) {
    if (v->steps.empty() || v->steps.front().kind != PolynomialStep::Kind::Linear || v->input_dim != n) return {};
    maps.push_back(to_matrix64(v->steps.front().weight));
  }
  Matrix64 basis = orthonormal_row_basis(maps);
  return basis.cols >= n ? Matrix64() : basis;
}

HermiteExpansion hermite_expansion(const PolynomialView& view, double input_std, const Matrix64* basis) {
  check(input_std > 0 && std::isfinite(input_std), "polynomial moments: the input's standard deviation must be positive, got ",
        input_std);
  const Matrix64 Q = basis ? *basis : Matrix64();
  check(Q.cols == 0 || Q.rows == view.input_dim, "polynomial moments: an input basis of ", Q.rows, " rows for ", view.arch,
        "'s ", view.input_dim, " input features");
  PolynomialOps ops{view.positions * (Q.cols > 0 ? Q.cols : view.input_dim)};
  State<PolynomialOps> h = state_before_head(ops, view, input_std, Q);
  HermiteExpansion e;
  e.arch = view.arch;
  e.basis = Q;
  e.variables = ops.variables, e.positions = view.positions, e.input_std = input_std;
  const int64_t width = int64_t(h[0].size());
  const bool has_head = !view.steps.empty() && view.steps.back().kind == PolynomialStep::Kind::Linear;
  const Matrix64 W = has_head ? to_matrix64(view.steps.back().weight) : Matrix64::identity(width);
  const Matrix64 b = has_head && view.steps.back().bias.defined() ? to_matrix64(view.steps.back().bias) : Matrix64();
  check(W.cols == width, "polynomial moments: the head of ", view.arch, " reads ", W.cols, " features, the state has ", width);
  e.classes = W.rows;
  for (const auto& ht : h)
    for (const DensePolynomial& p : ht) e.degree = std::max(e.degree, p.degree);
  const Sizes& S = sizes_for(e.variables, e.degree);
  for (int64_t t = 0; t < view.positions; ++t) {
    Matrix64 coords(width + 1, S.at(e.variables, e.degree));  // row 0: the constant coordinate of h̃
    coords(0, 0) = 1.0;
    for (int64_t i = 0; i < width; ++i) {
      DensePolynomial& p = h[size_t(t)][size_t(i)];
      widen(p, e.degree);
      const std::vector<double> c = to_hermite(std::move(p)).coefficients;
      std::copy(c.begin(), c.end(), &coords.data[size_t((i + 1) * coords.cols)]);
    }
    e.state.push_back(std::move(coords));
    Matrix64 head(W.rows, width + 1);
    for (int64_t o = 0; o < W.rows; ++o) {
      head(o, 0) = b.rows == 0 ? 0.0 : b(b.rows == 1 ? 0 : t, o);
      for (int64_t i = 0; i < width; ++i) head(o, i + 1) = W(o, i);
    }
    e.head.push_back(std::move(head));
  }
  return e;
}

std::vector<double> hermite_output_inner(const HermiteExpansion& a, const HermiteExpansion& b) {
  check(a.variables == b.variables && a.positions == b.positions && a.classes == b.classes,
        "polynomial moments: ", a.arch, " and ", b.arch, " differ in their input or output sizes");
  check(a.input_std == b.input_std, "polynomial moments: the two expansions were made for different input scales");
  check(a.basis.rows == b.basis.rows && a.basis.data == b.basis.data,
        "polynomial moments: the two expansions read the input through different bases");
  const int64_t n = a.variables;
  const int top = std::max(a.degree, b.degree);
  const Sizes& S = sizes_for(n, top);
  std::vector<double> norms(size_t(S.at(n, top)));
  hermite_norms(S, norms.data(), top, n, 1.0);
  std::vector<double> out(size_t(a.positions * a.classes));
  for (int64_t t = 0; t < a.positions; ++t) {
    Matrix64 sa = relayout(a.state[size_t(t)], n, a.degree, top);
    const Matrix64 sb = relayout(b.state[size_t(t)], n, b.degree, top);
    for (int64_t i = 0; i < sa.rows; ++i)
      for (int64_t k = 0; k < sa.cols; ++k) sa(i, k) *= norms[size_t(k)];
    const Matrix64 gram = matmul(sa, sb, false, true);  // E[h̃_a,i h̃_b,j] = Σ_α α! â_iα b̂_jα
    const Matrix64 left = matmul(a.head[size_t(t)], gram);  // (classes, 1 + width_b)
    const Matrix64& right = b.head[size_t(t)];
    for (int64_t o = 0; o < a.classes; ++o) {
      double v = 0;
      for (int64_t j = 0; j < right.cols; ++j) v += left(o, j) * right(o, j);
      out[size_t(t * a.classes + o)] = v;
    }
  }
  return out;
}

double ExactInnerProducts::cosine() const { return ab / std::sqrt(aa * bb); }

ExactInnerProducts exact_inner_products(const PolynomialView& a, const PolynomialView& b, double input_std) {
  const HermiteExpansion ha = hermite_expansion(a, input_std), hb = hermite_expansion(b, input_std);
  auto total = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum;
  };
  return {total(hermite_output_inner(ha, hb)), total(hermite_output_inner(ha, ha)), total(hermite_output_inner(hb, hb))};
}

}  // namespace adjoint
