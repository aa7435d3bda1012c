#include "analysis/similarity/attention_moments.h"

#include <algorithm>
#include <array>
#include <functional>
#include <vector>

#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

constexpr int kCap = -1;    // a leg left unmatched: it contributes its mean
constexpr int kOutA = -10;  // the x side's free output index
constexpr int kOutB = -11;  // the y side's

// All partial matchings of n legs: partner[l] is the leg matched with l, or kCap.
std::vector<std::vector<int>> all_matchings(int n) {
  std::vector<std::vector<int>> out;
  std::vector<int> partner(static_cast<size_t>(n), -2);  // -2: not decided yet
  std::function<void(int)> extend = [&](int l) {
    while (l < n && partner[size_t(l)] != -2) ++l;
    if (l == n) {
      out.push_back(partner);
      return;
    }
    partner[size_t(l)] = kCap;
    extend(l + 1);
    for (int q = l + 1; q < n; ++q)
      if (partner[size_t(q)] == -2) {
        partner[size_t(l)] = q, partner[size_t(q)] = l;
        extend(l + 1);
        partner[size_t(q)] = -2;
      }
    partner[size_t(l)] = -2;
  };
  extend(0);
  return out;
}

// How the legs of a product are joined: every index node has two ports, two legs or a leg
// and an output. other_port[l] is what shares l's node.
struct Layout {
  std::vector<int> other_port;
  int leg_at_a = 0, leg_at_b = 0;  // the legs sharing a node with the two outputs
  std::vector<std::vector<int>> matchings;
};

// The legs of one term: each leg's mean (a column) and its covariance blocks with the others.
struct Legs {
  std::vector<Matrix64> mean;
  std::vector<std::vector<Matrix64>> cov;  // cov[l][q]: rows l's index, columns q's
};

// A row-major block of doubles in a buffer reused across the terms of the sum.
struct Block {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  void reset(int64_t r, int64_t c) {
    rows = r, cols = c;
    v.assign(size_t(r * c), 0.0);
  }
};

// out = r · m.
void multiply(const Block& r, const Matrix64& m, Block& out) {
  out.reset(r.rows, m.cols);
  for (int64_t i = 0; i < r.rows; ++i)
    for (int64_t l = 0; l < r.cols; ++l) {
      const double x = r.v[size_t(i * r.cols + l)];
      if (x == 0.0) continue;
      const double* row = m.data.data() + l * m.cols;
      double* o = out.v.data() + i * out.cols;
      for (int64_t j = 0; j < m.cols; ++j) o[j] += x * row[j];
    }
}

// Follows a path from `leg`, carrying r (rows: the path's start index, columns: leg's index),
// until a cap (r becomes r·mean, a column) or output B (r as it is; reached_b is set).
void walk(const Layout& lay, const std::vector<int>& partner, const Legs& d, int leg, Block& r, Block& spare,
          std::vector<char>& used, bool& reached_b) {
  while (true) {
    used[size_t(leg)] = 1;
    const int p = partner[size_t(leg)];
    if (p == kCap) {
      multiply(r, d.mean[size_t(leg)], spare);
      std::swap(r, spare);
      return;
    }
    used[size_t(p)] = 1;
    multiply(r, d.cov[size_t(leg)][size_t(p)], spare);
    std::swap(r, spare);
    const int next = lay.other_port[size_t(p)];
    if (next == kOutB) {
      reached_b = true;
      return;
    }
    leg = next;
  }
}

void set_identity(Block& b, int64_t n) {
  b.reset(n, n);
  for (int64_t i = 0; i < n; ++i) b.v[size_t(i * n + i)] = 1.0;
}

// Σ over matchings of the term's value: (d_a × d_b), the outputs' indices.
Matrix64 expectation(const Layout& lay, const Legs& d) {
  const int n = int(lay.other_port.size());
  const int64_t da = d.mean[size_t(lay.leg_at_a)].rows, db = d.mean[size_t(lay.leg_at_b)].rows;
  Matrix64 total(da, db);
  std::vector<char> used(static_cast<size_t>(n));
  Block out, vb, r, spare;
  for (const std::vector<int>& partner : lay.matchings) {
    std::fill(used.begin(), used.end(), 0);
    bool reached_b = false;
    set_identity(out, da);
    walk(lay, partner, d, lay.leg_at_a, out, spare, used, reached_b);
    if (!reached_b) {  // output A's path ends at a cap, so does B's: an outer product
      bool unused = false;
      set_identity(vb, db);
      walk(lay, partner, d, lay.leg_at_b, vb, spare, used, unused);
    }
    double scalar = 1.0;
    for (int l = 0; l < n && scalar != 0.0; ++l)  // paths between two caps
      if (!used[size_t(l)] && partner[size_t(l)] == kCap) {
        used[size_t(l)] = 1;
        const Matrix64& m = d.mean[size_t(l)];
        r.reset(1, m.rows);
        std::copy(m.data.begin(), m.data.end(), r.v.begin());
        bool unused = false;
        walk(lay, partner, d, lay.other_port[size_t(l)], r, spare, used, unused);
        scalar *= r.v[0];
      }
    for (int l = 0; l < n && scalar != 0.0; ++l) {  // the rest are cycles: traces
      if (used[size_t(l)]) continue;
      set_identity(r, d.mean[size_t(l)].rows);
      for (int leg = l;;) {
        const int p = partner[size_t(leg)];
        used[size_t(leg)] = used[size_t(p)] = 1;
        multiply(r, d.cov[size_t(leg)][size_t(p)], spare);
        std::swap(r, spare);
        leg = lay.other_port[size_t(p)];
        if (leg == l) break;
      }
      double trace = 0;
      for (int64_t i = 0; i < r.rows; ++i) trace += r.v[size_t(i * r.cols + i)];
      scalar *= trace;
    }
    if (scalar == 0.0) continue;
    if (reached_b) {
      for (size_t i = 0; i < total.data.size(); ++i) total.data[i] += scalar * out.v[i];
    } else {
      for (int64_t i = 0; i < da; ++i)
        for (int64_t j = 0; j < db; ++j) total(i, j) += scalar * out.v[size_t(i)] * vb.v[size_t(j)];
    }
  }
  return total;
}

// The ten legs of y_x[t] y_y[t']: x's q1_t, k1_u, q2_t, k2_u, v_u (indices i, i, j, j, m) and y's.
const Layout& ten_legs() {
  static const Layout layout = [] {
    Layout l;
    l.other_port = {1, 0, 3, 2, kOutA, 6, 5, 8, 7, kOutB};
    l.leg_at_a = 4, l.leg_at_b = 9;
    l.matchings = all_matchings(10);
    return l;
  }();
  return layout;
}

// The six legs of z_x y_y[t']: the state itself (its own node with output A), then y's five.
const Layout& six_legs() {
  static const Layout layout = [] {
    Layout l;
    l.other_port = {kOutA, 2, 1, 4, 3, kOutB};
    l.leg_at_a = 0, l.leg_at_b = 5;
    l.matchings = all_matchings(6);
    return l;
  }();
  return layout;
}

// One side's attention legs as rows of a matrix acting on the state: block (type, position,
// head) of d_head rows, types q1, k1, q2, k2, v; with the legs' means and the layer's proj.
struct Side {
  int64_t dim, heads, dh, positions;
  Matrix64 legs;  // (5·T·heads·dh, n)
  Matrix64 mean;  // legs · μ, a column
  Matrix64 proj;  // (dim, dim)
  double scale;   // residual scale / d_head²
  int64_t block(int64_t type, int64_t position, int64_t head) const { return ((type * positions + position) * heads + head) * dh; }
};

Side side_of(const PolynomialStep& s, int64_t T, const Matrix64& sigma_self) {
  const Matrix64 qkv = to_matrix64(s.qkv);
  const int64_t dim = qkv.cols, dh = dim / s.heads, n = 1 + T * dim;
  check(sigma_self.rows == n, "attention moments: a state of ", sigma_self.rows, " coordinates for ", T, " positions of ",
        dim);
  Side side{dim, s.heads, dh, T, Matrix64(5 * T * dim, n), Matrix64(), to_matrix64(s.proj),
            s.scale / double(dh * dh)};
  for (int64_t type = 0; type < 5; ++type)
    for (int64_t p = 0; p < T; ++p)
      for (int64_t k = 0; k < s.heads; ++k)
        for (int64_t j = 0; j < dh; ++j)
          for (int64_t i = 0; i < dim; ++i)
            side.legs(side.block(type, p, k) + j, 1 + p * dim + i) = qkv(type * dim + k * dh + j, i);
  side.mean = matmul(side.legs, columns(sigma_self, 0, 1));
  return side;
}

Matrix64 rows_of(const Matrix64& m, int64_t begin, int64_t count) {
  Matrix64 out(count, m.cols);
  std::copy(m.data.begin() + begin * m.cols, m.data.begin() + (begin + count) * m.cols, out.data.begin());
  return out;
}

Matrix64 block_of(const Matrix64& m, int64_t row, int64_t rows, int64_t col, int64_t cols) {
  Matrix64 out(rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out(r, c) = m(row + r, col + c);
  return out;
}

Matrix64 centred(const Matrix64& sigma_xy, const Matrix64& mean_x, const Matrix64& mean_y) {
  Matrix64 c = sigma_xy;
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) c(i, j) -= mean_x(i, 0) * mean_y(j, 0);
  return c;
}

// The legs of one side at (t, u, k), as (type, position) pairs: q1_t, k1_u, q2_t, k2_u, v_u.
std::array<int64_t, 5> leg_blocks(const Side& s, int64_t t, int64_t u, int64_t k) {
  return {s.block(0, t, k), s.block(1, u, k), s.block(2, t, k), s.block(3, u, k), s.block(4, u, k)};
}

// The (t, u ≤ t, head) triples of one side's attention terms.
std::vector<std::array<int64_t, 3>> attention_terms(const Side& s) {
  std::vector<std::array<int64_t, 3>> terms;
  for (int64_t t = 0; t < s.positions; ++t)
    for (int64_t u = 0; u <= t; ++u)
      for (int64_t k = 0; k < s.heads; ++k) terms.push_back({t, u, k});
  return terms;
}

// E[z_x y_yᵀ] (n_x × T·dim_y, the constant's column included in z's rows), six legs per term.
// Terms run in parallel; their results are added in a fixed order.
Matrix64 state_times_attention(const Side& y, const Matrix64& mean_x, const Matrix64& cov_x_legs_y,
                               const Matrix64& cov_legs_y) {
  const int64_t nx = mean_x.rows;
  const auto terms = attention_terms(y);
  std::vector<Matrix64> projected(terms.size());
  parallel_for(int64_t(terms.size()), 1, [&](int64_t begin, int64_t end) {
    Legs d{std::vector<Matrix64>(6), std::vector<std::vector<Matrix64>>(6, std::vector<Matrix64>(6))};
    d.mean[0] = mean_x;
    for (int64_t c = begin; c < end; ++c) {
      const auto [t, u, k] = terms[size_t(c)];
      const auto b = leg_blocks(y, t, u, k);
      for (int l = 0; l < 5; ++l) {
        d.mean[size_t(l + 1)] = rows_of(y.mean, b[size_t(l)], y.dh);
        d.cov[0][size_t(l + 1)] = block_of(cov_x_legs_y, 0, nx, b[size_t(l)], y.dh);
        d.cov[size_t(l + 1)][0] = transpose(d.cov[0][size_t(l + 1)]);
        for (int q = 0; q < 5; ++q)
          d.cov[size_t(l + 1)][size_t(q + 1)] = block_of(cov_legs_y, b[size_t(l)], y.dh, b[size_t(q)], y.dh);
      }
      // (n_x × d_head) over v's index m, then through proj's columns of head k: (n_x × dim).
      projected[size_t(c)] = matmul(expectation(six_legs(), d), columns(y.proj, k * y.dh, (k + 1) * y.dh), false, true);
    }
  });
  Matrix64 out(nx, y.positions * y.dim);
  for (size_t c = 0; c < terms.size(); ++c) {
    const int64_t t = terms[c][0];
    for (int64_t r = 0; r < nx; ++r)
      for (int64_t o = 0; o < y.dim; ++o) out(r, t * y.dim + o) += y.scale * projected[c](r, o);
  }
  return out;
}

}  // namespace

int64_t partial_matchings(int64_t legs) { return int64_t(all_matchings(int(legs)).size()); }

Matrix64 attention_next_moments(const PolynomialStep& sx, const PolynomialStep& sy, int64_t T, const Matrix64& sigma_xy,
                                const Matrix64& sigma_xx, const Matrix64& sigma_yy) {
  check(sx.residual && sy.residual, "attention moments: the attention layers must be residual");
  const Side x = side_of(sx, T, sigma_xx), y = side_of(sy, T, sigma_yy);
  const Matrix64 mean_x = columns(sigma_xx, 0, 1), mean_y = columns(sigma_yy, 0, 1);
  const Matrix64 cov_xy = centred(sigma_xy, mean_x, mean_y);
  const Matrix64 cov_xx = centred(sigma_xx, mean_x, mean_x), cov_yy = centred(sigma_yy, mean_y, mean_y);
  // Covariances between legs (and between the state and the other side's legs).
  const Matrix64 legs_xx = matmul(matmul(x.legs, cov_xx), x.legs, false, true);
  const Matrix64 legs_yy = matmul(matmul(y.legs, cov_yy), y.legs, false, true);
  const Matrix64 legs_xy = matmul(matmul(x.legs, cov_xy), y.legs, false, true);
  const Matrix64 state_x_legs_y = matmul(cov_xy, y.legs, false, true);              // (n_x, legs_y)
  const Matrix64 state_y_legs_x = matmul(transpose(cov_xy), x.legs, false, true);   // (n_y, legs_x)

  Matrix64 next = sigma_xy;
  // z_x · s_y y_yᵀ and s_x y_x · z_yᵀ.
  const Matrix64 zy = state_times_attention(y, mean_x, state_x_legs_y, legs_yy);
  const Matrix64 yz = state_times_attention(x, mean_y, state_y_legs_x, legs_xx);  // E[z_y y_xᵀ]
  for (int64_t r = 0; r < next.rows; ++r)
    for (int64_t c = 0; c < T * y.dim; ++c) next(r, 1 + c) += zy(r, c);
  for (int64_t r = 0; r < T * x.dim; ++r)
    for (int64_t c = 0; c < next.cols; ++c) next(1 + r, c) += yz(c, r);
  // s_x s_y y_x y_yᵀ: ten legs per term, every pair of the two sides' terms in parallel.
  const auto terms_x = attention_terms(x), terms_y = attention_terms(y);
  const int64_t pairs = int64_t(terms_x.size() * terms_y.size());
  std::vector<Matrix64> products(static_cast<size_t>(pairs));
  parallel_for(pairs, 1, [&](int64_t begin, int64_t end) {
    Legs d{std::vector<Matrix64>(10), std::vector<std::vector<Matrix64>>(10, std::vector<Matrix64>(10))};
    for (int64_t c = begin; c < end; ++c) {
      const auto [t, u, k] = terms_x[size_t(c) / terms_y.size()];
      const auto [t2, u2, k2] = terms_y[size_t(c) % terms_y.size()];
      const auto bx = leg_blocks(x, t, u, k), by = leg_blocks(y, t2, u2, k2);
      for (int l = 0; l < 10; ++l) {
        const bool lx = l < 5;
        const int64_t bl = lx ? bx[size_t(l)] : by[size_t(l - 5)];
        d.mean[size_t(l)] = rows_of(lx ? x.mean : y.mean, bl, x.dh);
        for (int q = 0; q < 10; ++q) {
          const bool qx = q < 5;
          const int64_t bq = qx ? bx[size_t(q)] : by[size_t(q - 5)];
          if (lx && qx) d.cov[size_t(l)][size_t(q)] = block_of(legs_xx, bl, x.dh, bq, x.dh);
          else if (!lx && !qx) d.cov[size_t(l)][size_t(q)] = block_of(legs_yy, bl, y.dh, bq, y.dh);
          else if (lx) d.cov[size_t(l)][size_t(q)] = block_of(legs_xy, bl, x.dh, bq, y.dh);
          else d.cov[size_t(l)][size_t(q)] = transpose(block_of(legs_xy, bq, x.dh, bl, y.dh));
        }
      }
      // (m, m') of the two v legs, then through proj's columns of heads k and k2.
      products[size_t(c)] = matmul(matmul(columns(x.proj, k * x.dh, (k + 1) * x.dh), expectation(ten_legs(), d)),
                                   columns(y.proj, k2 * y.dh, (k2 + 1) * y.dh), false, true);
    }
  });
  for (int64_t c = 0; c < pairs; ++c) {
    const int64_t t = terms_x[size_t(c) / terms_y.size()][0], t2 = terms_y[size_t(c) % terms_y.size()][0];
    const Matrix64& yy = products[size_t(c)];
    for (int64_t o = 0; o < x.dim; ++o)
      for (int64_t o2 = 0; o2 < y.dim; ++o2) next(1 + t * x.dim + o, 1 + t2 * y.dim + o2) += x.scale * y.scale * yy(o, o2);
  }
  return next;
}

}  // namespace adjoint
