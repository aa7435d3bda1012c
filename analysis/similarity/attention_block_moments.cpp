#include "analysis/similarity/attention_block_moments.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "analysis/similarity/polynomial_moments.h"
#include "engine/error.h"

namespace adjoint {

bool single_attention_block(const PolynomialView& v) {
  using K = PolynomialStep::Kind;
  return v.steps.size() == 4 && v.steps[0].kind == K::Linear && v.steps[1].kind == K::Attention &&
         v.steps[1].residual && v.steps[2].kind == K::Bilinear && v.steps[2].residual && v.steps[3].kind == K::Linear;
}

namespace {

using Poly = DensePolynomial;

double binomial(int64_t n, int64_t k) {  // C(n, k), in double: the cost model reads large ones
  double c = 1;
  for (int64_t i = 1; i <= k; ++i) c = c * double(n - k + i) / double(i);
  return std::round(c);
}

// One network, prepared for any partner: its polynomials of each position's variables y_t.
struct Side {
  int64_t T = 0, k = 0, d = 0, dh = 0, M = 0, classes = 0;  // M = heads·dh² score terms
  int64_t D1() const { return d + 1; }
  std::vector<std::vector<Poly>> Q;          // [t][m]: q1_i·q2_j of head h, m = (h·dh + i)·dh + j (degree 2)
  std::vector<std::vector<Poly>> c_hat;      // [t][a], a = 0..d: (1, h_t + the attention's u = t term) (degree ≤ 5)
  std::vector<std::vector<Poly>> X_hermite;  // [u][m·(d+1) + a]: K̂_m,a(y_u) = κ_m·ν_h,a, Hermite basis (a = 0: zero)
  std::vector<std::vector<Poly>> nu;         // [u][h·d + a]: ν_h,a = s/dh²·(proj_h v_h)_a (degree 1)
  std::vector<std::vector<Poly>> kappa_pairs;  // [u][pair (m ≤ m')]: κ_m·κ_m', κ_m = k1_i·k2_j (degree 4)
  std::vector<std::pair<int64_t, int64_t>> pairs;  // the pairs m ≤ m', in that order
  int64_t heads = 0;
  std::vector<Matrix64> G;                   // [o]: Ĝ_o, symmetric, (d+1)², without the head's bias
  Matrix64 head_bias;                        // (1 or T, classes), or empty
  // Ĝ_o with the head's bias of position t (it sits at (0, 0): r̃_0 = 1).
  Matrix64 form(int64_t t, int64_t o) const {
    Matrix64 g = G[size_t(o)];
    if (head_bias.rows > 0) g(0, 0) += head_bias(head_bias.rows == 1 ? 0 : t, o);
    return g;
  }
};

Poly constant(int64_t variables, double c) { return monomial(variables, std::vector<int>(size_t(variables), 0), c); }

Side prepare(const PolynomialView& v, double input_std, const Matrix64& basis) {
  check(single_attention_block(v), "attention block moments: ", v.arch,
        " is not one block of embedding, polynomial attention, bilinear MLP and head");
  const PolynomialStep &embed = v.steps[0], &attention = v.steps[1], &mlp = v.steps[2], &head = v.steps[3];
  Side s;
  s.T = v.positions;
  s.k = basis.cols > 0 ? basis.cols : v.input_dim;
  Matrix64 W = to_matrix64(embed.weight);  // (d, input features)
  if (basis.cols > 0) W = matmul(W, basis);
  const Matrix64 pos = embed.bias.defined() ? to_matrix64(embed.bias) : Matrix64();
  s.d = W.rows;
  const Matrix64 qkv = to_matrix64(attention.qkv), proj = to_matrix64(attention.proj);
  const int64_t heads = attention.heads;
  s.heads = heads;
  s.dh = s.d / heads;
  s.M = heads * s.dh * s.dh;
  check(qkv.rows == 5 * s.d && qkv.cols == s.d && proj.rows == s.d, "attention block moments: ", attention.name,
        " does not match the embedding's width ", s.d);
  const double score_scale = attention.scale / double(s.dh * s.dh);
  for (int64_t t = 0; t < s.T; ++t) {
    // h_t = pos_t + σ·W y_t, then the five projections q1, k1, q2, k2, v.
    std::vector<Poly> h;
    for (int64_t a = 0; a < s.d; ++a) {
      Poly p = constant(s.k, pos.rows == 0 ? 0.0 : pos(pos.rows == 1 ? 0 : t, a));
      for (int64_t j = 0; j < s.k; ++j) {
        std::vector<int> powers(size_t(s.k), 0);
        powers[size_t(j)] = 1;
        accumulate(p, monomial(s.k, powers, 1.0), input_std * W(a, j));
      }
      h.push_back(std::move(p));
    }
    std::vector<Poly> part;
    for (int64_t r = 0; r < qkv.rows; ++r) {
      Poly p = constant(s.k, 0.0);
      for (int64_t a = 0; a < s.d; ++a) accumulate(p, h[size_t(a)], qkv(r, a));
      part.push_back(std::move(p));
    }
    auto at = [&](int64_t which, int64_t hd, int64_t i) -> const Poly& { return part[size_t(which * s.d + hd * s.dh + i)]; };
    // ν_h = s/dh² · proj[:, head h] v_h (degree 1), then K̂_m,a = k1_i·k2_j·ν_h,a and Q_m = q1_i·q2_j.
    std::vector<Poly> q, kappa, nu, x(size_t(s.M * s.D1()), constant(s.k, 0.0));
    for (int64_t hd = 0; hd < heads; ++hd)
      for (int64_t a = 0; a < s.d; ++a) {
        Poly p = constant(s.k, 0.0);
        for (int64_t j = 0; j < s.dh; ++j) accumulate(p, at(4, hd, j), score_scale * proj(a, hd * s.dh + j));
        nu.push_back(std::move(p));
      }
    for (int64_t hd = 0; hd < heads; ++hd)
      for (int64_t i = 0; i < s.dh; ++i)
        for (int64_t j = 0; j < s.dh; ++j) {
          const int64_t m = (hd * s.dh + i) * s.dh + j;
          Poly qm = constant(s.k, 0.0), km = constant(s.k, 0.0);
          accumulate_product(qm, at(0, hd, i), at(2, hd, j), 1.0);
          accumulate_product(km, at(1, hd, i), at(3, hd, j), 1.0);
          for (int64_t a = 0; a < s.d; ++a)
            accumulate_product(x[size_t(m * s.D1() + 1 + a)], km, nu[size_t(hd * s.d + a)], 1.0);
          q.push_back(std::move(qm));
          kappa.push_back(std::move(km));
        }
    if (s.pairs.empty())
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t n = m; n < s.M; ++n) s.pairs.emplace_back(m, n);
    std::vector<Poly> kappa_pairs;
    for (const auto& [m, n] : s.pairs) {
      Poly p = constant(s.k, 0.0);
      accumulate_product(p, kappa[size_t(m)], kappa[size_t(n)], 1.0);
      kappa_pairs.push_back(std::move(p));
    }
    std::vector<Poly> c_hat{constant(s.k, 1.0)};
    for (int64_t a = 0; a < s.d; ++a) {
      Poly c = h[size_t(a)];
      for (int64_t m = 0; m < s.M; ++m) accumulate_product(c, q[size_t(m)], x[size_t(m * s.D1() + 1 + a)], 1.0);
      c_hat.push_back(std::move(c));
    }
    std::vector<Poly> xh;
    for (const Poly& p : x) xh.push_back(to_hermite(p));
    s.Q.push_back(std::move(q));
    s.c_hat.push_back(std::move(c_hat));
    s.X_hermite.push_back(std::move(xh));
    s.nu.push_back(std::move(nu));
    s.kappa_pairs.push_back(std::move(kappa_pairs));
  }
  // f_o = b_o + U_o·r + s·(U D)_o·((L r̃) ⊙ (R r̃)) = r̃ᵀ Ĝ_o r̃, symmetrised.
  const Matrix64 L = to_matrix64(mlp.left), R = to_matrix64(mlp.right);
  const Matrix64 D = mlp.down.defined() ? to_matrix64(mlp.down) : Matrix64::identity(L.rows);
  const Matrix64 U = to_matrix64(head.weight);
  check(L.cols == s.D1() && D.rows == s.d && U.cols == s.d, "attention block moments: ", mlp.name, " or ", head.name,
        " does not match the width ", s.d);
  const Matrix64 UD = matmul(U, D);  // (classes, hidden)
  s.classes = U.rows;
  if (head.bias.defined()) s.head_bias = to_matrix64(head.bias);
  for (int64_t o = 0; o < s.classes; ++o) {
    Matrix64 g(s.D1(), s.D1());
    for (int64_t j = 0; j < L.rows; ++j) {
      const double w = mlp.scale * UD(o, j);
      if (w == 0.0) continue;
      for (int64_t a = 0; a < s.D1(); ++a)
        for (int64_t b = 0; b < s.D1(); ++b) g(a, b) += w * L(j, a) * R(j, b);
    }
    for (int64_t a = 0; a < s.d; ++a) g(0, 1 + a) += U(o, a);
    Matrix64 sym(s.D1(), s.D1());
    for (int64_t a = 0; a < s.D1(); ++a)
      for (int64_t b = 0; b < s.D1(); ++b) sym(a, b) = 0.5 * (g(a, b) + g(b, a));
    s.G.push_back(std::move(sym));
  }
  return s;
}

// Moments of S (or of one position's X) for one output o of each side: with A's factors S_ma
// (m < M_A, a ≤ d_A) and B's S'_nc, and the pairs of a side contracted by its Ĝ:
//   mu = E[S_ma], mu_b = E[S'_nc], A = E[S_mᵀĜS_m'], B = E[S'_nᵀĜ'S'_n'], C = E[S_ma S'_nc],
//   V = E[(S_mᵀĜS_m') S'_nc], V2 = E[S_ma (S'_nᵀĜ'S'_n')], W = E[(S_mᵀĜS_m')(S'_nᵀĜ'S'_n')].
// Rows and columns flatten (m, a) as m·(d+1) + a and (m, m') as m·M + m'.
struct Moments {
  Matrix64 mu, mu_b, A, B, C, V, V2, W;
  Moments(const Side& a, const Side& b)
      : mu(a.M, a.D1()), mu_b(b.M, b.D1()), A(a.M, a.M), B(b.M, b.M), C(a.M * a.D1(), b.M * b.D1()),
        V(a.M * a.M, b.M * b.D1()), V2(a.M * a.D1(), b.M * b.M), W(a.M * a.M, b.M * b.M) {}
};

// (Ĝ μ_m)_a for every m: a side's mean contracted with its form.
Matrix64 form_times_mean(const Matrix64& mu, const Matrix64& g) { return matmul(mu, g); }  // g symmetric

// The moments of one position u's X_u for the output o, from its polynomials. A side's pair
// P_mm' = X_mᵀĜX_m' = κ_m κ_m' · η_hh' with η_hh' = ν_hᵀĜν_h' (h, h' the heads of m, m'):
// symmetric in m, m', so each pair m ≤ m' is written out once (degree 6).
Moments position_moments(const Side& a, const Side& b, int64_t u, const Matrix64& ga, const Matrix64& gb) {
  Moments x(a, b);
  const std::vector<Poly> &xa = a.X_hermite[size_t(u)], &xb = b.X_hermite[size_t(u)];
  for (int64_t i = 0; i < a.M * a.D1(); ++i) x.mu.data[size_t(i)] = xa[size_t(i)].coefficients[0];
  for (int64_t i = 0; i < b.M * b.D1(); ++i) x.mu_b.data[size_t(i)] = xb[size_t(i)].coefficients[0];
  x.C = hermite_gram(xa, xb);
  auto pair_polynomials = [&](const Side& s, const Matrix64& g, Matrix64& mean) {
    const std::vector<Poly>& nu = s.nu[size_t(u)];
    std::vector<Poly> eta;  // [h·heads + h']
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t h2 = 0; h2 < s.heads; ++h2) {
        Poly e = constant(s.k, 0.0);
        for (int64_t i = 0; i < s.d; ++i)
          for (int64_t j = 0; j < s.d; ++j)
            if (g(1 + i, 1 + j) != 0.0) accumulate_product(e, nu[size_t(h * s.d + i)], nu[size_t(h2 * s.d + j)], g(1 + i, 1 + j));
        eta.push_back(std::move(e));
      }
    std::vector<Poly> p;
    const int64_t per_head = s.dh * s.dh;
    for (size_t k = 0; k < s.pairs.size(); ++k) {
      const auto [m, n] = s.pairs[k];
      Poly y = constant(s.k, 0.0);
      accumulate_product(y, s.kappa_pairs[size_t(u)][k], eta[size_t((m / per_head) * s.heads + n / per_head)], 1.0);
      p.push_back(to_hermite(std::move(y)));
      mean(m, n) = mean(n, m) = p.back().coefficients[0];
    }
    return p;
  };
  const std::vector<Poly> pa = pair_polynomials(a, ga, x.A), pb = pair_polynomials(b, gb, x.B);
  // Gram matrices over the pairs, spread to both orders of each.
  const Matrix64 v = hermite_gram(pa, xb), v2 = hermite_gram(xa, pb), w = hermite_gram(pa, pb);
  for (size_t k = 0; k < a.pairs.size(); ++k) {
    const auto [m, n] = a.pairs[k];
    for (int64_t j = 0; j < v.cols; ++j) x.V(m * a.M + n, j) = x.V(n * a.M + m, j) = v(int64_t(k), j);
    for (size_t l = 0; l < b.pairs.size(); ++l) {
      const auto [p, q] = b.pairs[l];
      const double value = w(int64_t(k), int64_t(l));
      x.W(m * a.M + n, p * b.M + q) = x.W(n * a.M + m, p * b.M + q) = x.W(m * a.M + n, q * b.M + p) =
          x.W(n * a.M + m, q * b.M + p) = value;
    }
  }
  for (size_t l = 0; l < b.pairs.size(); ++l) {
    const auto [p, q] = b.pairs[l];
    for (int64_t i = 0; i < v2.rows; ++i) x.V2(i, p * b.M + q) = x.V2(i, q * b.M + p) = v2(i, int64_t(l));
  }
  return x;
}

// C's (d_a+1)×(d_b+1) block of each (m, n) as one row: rows (m, n), columns (i, c).
Matrix64 blocks_as_rows(const Matrix64& c, int64_t Ma, int64_t Mb, int64_t Da, int64_t Db) {
  Matrix64 r(Ma * Mb, Da * Db);
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t i = 0; i < Da; ++i)
        for (int64_t k = 0; k < Db; ++k) r(m * Mb + n, i * Db + k) = c(m * Da + i, n * Db + k);
  return r;
}

// Ĝ C_mn Ĝ' for every block of C (Ĝ symmetric, so Ĝᵀ C Ĝ' = Ĝ C Ĝ'), laid out as blocks_as_rows.
Matrix64 sandwiched_blocks(const Matrix64& c, const Matrix64& ga, const Matrix64& gb, int64_t Ma, int64_t Mb) {
  const int64_t Da = ga.rows, Db = gb.rows;
  const Matrix64 rows = blocks_as_rows(c, Ma, Mb, Da, Db);
  Matrix64 out(Ma * Mb, Da * Db);
  for (int64_t r = 0; r < rows.rows; ++r) {
    Matrix64 block(Da, Db);
    std::copy(rows.data.begin() + r * Da * Db, rows.data.begin() + (r + 1) * Da * Db, block.data.begin());
    const Matrix64 gbg = matmul(matmul(ga, block), gb);
    std::copy(gbg.data.begin(), gbg.data.end(), out.data.begin() + r * Da * Db);
  }
  return out;
}

// S + X from the moments of S and of X, independent: every moment of the sum is the sum over
// which of its factors come from X (2^factors terms; factors of one kind give the same terms).
Moments absorb(const Moments& s, const Moments& x, const Side& a, const Side& b, const Matrix64& ga, const Matrix64& gb) {
  const int64_t Ma = a.M, Mb = b.M, Da = a.D1(), Db = b.D1();
  Moments r = s;
  auto add = [](Matrix64& into, const Matrix64& m) {
    for (size_t i = 0; i < into.data.size(); ++i) into.data[i] += m.data[i];
  };
  add(r.mu, x.mu), add(r.mu_b, x.mu_b), add(r.A, x.A), add(r.B, x.B), add(r.C, x.C), add(r.V, x.V), add(r.V2, x.V2),
      add(r.W, x.W);
  const Matrix64 gmu_s = form_times_mean(s.mu, ga), gmu_x = form_times_mean(x.mu, ga);
  const Matrix64 gmu_bs = form_times_mean(s.mu_b, gb), gmu_bx = form_times_mean(x.mu_b, gb);
  // A: one factor from each.
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Ma; ++n)
      for (int64_t i = 0; i < Da; ++i) r.A(m, n) += s.mu(m, i) * gmu_x(n, i) + x.mu(m, i) * gmu_s(n, i);
  for (int64_t m = 0; m < Mb; ++m)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t i = 0; i < Db; ++i) r.B(m, n) += s.mu_b(m, i) * gmu_bx(n, i) + x.mu_b(m, i) * gmu_bs(n, i);
  // C: the A factor from one, the B factor from the other.
  for (int64_t i = 0; i < Ma * Da; ++i)
    for (int64_t j = 0; j < Mb * Db; ++j) r.C(i, j) += s.mu.data[size_t(i)] * x.mu_b.data[size_t(j)] + x.mu.data[size_t(i)] * s.mu_b.data[size_t(j)];
  // V = E[(S_mᵀĜS_m') S'_nc]: A's pair from one and the B factor from the other, or one of A's
  // pair with the B factor and the other alone.
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Ma; ++n)
      for (int64_t j = 0; j < Mb * Db; ++j) {
        double v = s.A(m, n) * x.mu_b.data[size_t(j)] + x.A(m, n) * s.mu_b.data[size_t(j)];
        for (int64_t i = 0; i < Da; ++i)
          v += s.C(m * Da + i, j) * gmu_x(n, i) + s.C(n * Da + i, j) * gmu_x(m, i) + x.C(m * Da + i, j) * gmu_s(n, i) +
               x.C(n * Da + i, j) * gmu_s(m, i);
        r.V(m * Ma + n, j) += v;
      }
  for (int64_t i = 0; i < Ma * Da; ++i)
    for (int64_t m = 0; m < Mb; ++m)
      for (int64_t n = 0; n < Mb; ++n) {
        double v = s.mu.data[size_t(i)] * x.B(m, n) + x.mu.data[size_t(i)] * s.B(m, n);
        for (int64_t c = 0; c < Db; ++c)
          v += s.C(i, m * Db + c) * gmu_bx(n, c) + s.C(i, n * Db + c) * gmu_bx(m, c) + x.C(i, m * Db + c) * gmu_bs(n, c) +
               x.C(i, n * Db + c) * gmu_bs(m, c);
        r.V2(i, m * Mb + n) += v;
      }
  // W: three factors from one and one from the other (V, V2 with a mean), a pair from each
  // (A·B, or C·C across the sides). With Y[(mm', n), n'] = Σ_c V[mm', nc]·(Ĝ'μ')_n'c (one
  // dgemm over V's rows read as (n, c)), V's terms are Y + Y exchanging n and n'; V2's likewise.
  Matrix64 vs = s.V, vx = x.V;
  vs.rows = Ma * Ma * Mb, vs.cols = Db, vx.rows = vs.rows, vx.cols = Db;
  Matrix64 y = matmul(vs, gmu_bx, false, true);
  const Matrix64 yx = matmul(vx, gmu_bs, false, true);
  for (size_t i = 0; i < y.data.size(); ++i) y.data[i] += yx.data[i];
  std::vector<Matrix64> z;  // z[m](m', (n, n')) = Σ_a (Ĝμ)_m'a·V2[(m, a), (n, n')]
  for (int64_t m = 0; m < Ma; ++m) {
    Matrix64 block_s(Da, Mb * Mb), block_x(Da, Mb * Mb);
    std::copy(s.V2.data.begin() + m * Da * Mb * Mb, s.V2.data.begin() + (m + 1) * Da * Mb * Mb, block_s.data.begin());
    std::copy(x.V2.data.begin() + m * Da * Mb * Mb, x.V2.data.begin() + (m + 1) * Da * Mb * Mb, block_x.data.begin());
    Matrix64 zm = matmul(gmu_x, block_s);
    const Matrix64 zx = matmul(gmu_s, block_x);
    for (size_t i = 0; i < zm.data.size(); ++i) zm.data[i] += zx.data[i];
    z.push_back(std::move(zm));
  }
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t mm = 0; mm < Ma; ++mm)
      for (int64_t n = 0; n < Mb; ++n)
        for (int64_t nn = 0; nn < Mb; ++nn) {
          const int64_t row = m * Ma + mm, col = n * Mb + nn;
          r.W(row, col) += s.A(m, mm) * x.B(n, nn) + x.A(m, mm) * s.B(n, nn) + y(row * Mb + n, nn) + y(row * Mb + nn, n) +
                           z[size_t(m)](mm, col) + z[size_t(mm)](m, col);
        }
  // C·C: Σ Ĝ_ab Ĝ'_ce (C_S[ma,nc] C_X[m'b,n'e] + C_S[ma,n'e] C_X[m'b,nc]) and the same with S
  // and X exchanged. With T[(m,n),(b,e)] = (Ĝᵀ C_S,mn Ĝ')_be and P = T·C_Xᵀ over (b, e), the
  // exchanged terms are Pᵀ: W[mm', nn'] += P[(m,n),(m',n')] + P[(m,n'),(m',n)] + the transposes.
  const Matrix64 t = sandwiched_blocks(s.C, ga, gb, Ma, Mb), cx = blocks_as_rows(x.C, Ma, Mb, Da, Db);
  const Matrix64 p = matmul(t, cx, false, true);  // [(m,n), (m',n')]
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t mm = 0; mm < Ma; ++mm)
      for (int64_t n = 0; n < Mb; ++n)
        for (int64_t nn = 0; nn < Mb; ++nn)
          r.W(m * Ma + mm, n * Mb + nn) += p(m * Mb + n, mm * Mb + nn) + p(m * Mb + nn, mm * Mb + n) +
                                           p(mm * Mb + nn, m * Mb + n) + p(mm * Mb + n, m * Mb + nn);
  return r;
}

// A position's polynomials of y_t that the outputs' terms are made of (Hermite basis):
// B0[a·(d+1)+b] = ĉ_a ĉ_b, B1[m·(d+1)+b] = Q_m ĉ_b, B2[m·M+m'] = Q_m Q_m'. F0 = Σ Ĝ_ab B0_ab,
// F1_ma = 2 Σ_b Ĝ_ab B1_mb, F2 = B2: none depends on the output but through Ĝ.
struct Terms {
  std::vector<Poly> b0, b1, b2;
};
Terms position_terms(const Side& s, int64_t t) {
  Terms r;
  const auto &c = s.c_hat[size_t(t)], &q = s.Q[size_t(t)];
  auto product = [&](const Poly& x, const Poly& y) {
    Poly p = constant(s.k, 0.0);
    accumulate_product(p, x, y, 1.0);
    return to_hermite(std::move(p));
  };
  for (int64_t a = 0; a < s.D1(); ++a)
    for (int64_t b = 0; b < s.D1(); ++b) r.b0.push_back(product(c[size_t(a)], c[size_t(b)]));
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t b = 0; b < s.D1(); ++b) r.b1.push_back(product(q[size_t(m)], c[size_t(b)]));
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = 0; n < s.M; ++n) r.b2.push_back(product(q[size_t(m)], q[size_t(n)]));
  return r;
}

// E_t[B_i^A · B_j^B] for i, j ∈ {0, 1, 2}.
struct TermGrams {
  Matrix64 g[3][3];
};
TermGrams term_grams(const Terms& a, const Terms& b) {
  TermGrams r;
  const std::vector<Poly>* ta[3] = {&a.b0, &a.b1, &a.b2};
  const std::vector<Poly>* tb[3] = {&b.b0, &b.b1, &b.b2};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r.g[i][j] = hermite_gram(*ta[i], *tb[j]);
  return r;
}

// E[f_t,o · g_t,o] from the position's Grams, the two forms and the moments of S.
double output_inner(const TermGrams& tg, const Moments& s, const Side& a, const Side& b, const Matrix64& ga,
                    const Matrix64& gb) {
  const int64_t Ma = a.M, Mb = b.M, Da = a.D1(), Db = b.D1();
  // Each side's coefficients over its base polynomials: F0 = Σ Ĝ_ab B0_ab, F1_ma = 2 Σ_b Ĝ_ab B1_mb.
  const Matrix64 gmu = form_times_mean(s.mu, ga), gmu_b = form_times_mean(s.mu_b, gb);
  double total = 0;
  // F0·G0, F0·G1, F0·G2: Σ_ab Ĝ_ab E[B0_ab ·] against G's coefficients.
  auto b_side = [&](int64_t j, int64_t col) {  // the coefficient of B's base polynomial `col` of kind j in E_S[g]
    if (j == 0) return gb.data[size_t(col)];                    // G0 = Σ Ĝ'_ce B0'_ce
    if (j == 1) return 2.0 * gmu_b.data[size_t(col)];           // Σ_nc G1_nc μ'_nc = 2 Σ_ne B1'_ne (Ĝ'μ'_n)_e
    return s.B.data[size_t(col)];                               // Σ G2_nn' A'_nn'
  };
  for (int64_t j = 0; j < 3; ++j) {
    const Matrix64& g = tg.g[0][size_t(j)];
    for (int64_t row = 0; row < Da * Da; ++row) {
      const double w = ga.data[size_t(row)];
      if (w == 0.0) continue;
      for (int64_t col = 0; col < g.cols; ++col) total += w * g(row, col) * b_side(j, col);
    }
  }
  // F1·G0 and F2·G0 mirror the above.
  for (int64_t col = 0; col < Db * Db; ++col) {
    const double w = gb.data[size_t(col)];
    if (w == 0.0) continue;
    for (int64_t row = 0; row < Ma * Da; ++row) total += 2.0 * gmu.data[size_t(row)] * tg.g[1][0](row, col) * w;
    for (int64_t row = 0; row < Ma * Ma; ++row) total += s.A.data[size_t(row)] * tg.g[2][0](row, col) * w;
  }
  // F1·G1 = 4 Σ g11[mb,ne] (Ĝ C_mn Ĝ')_be.
  const Matrix64 gcg = sandwiched_blocks(s.C, ga, gb, Ma, Mb);
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t i = 0; i < Da; ++i)
        for (int64_t c = 0; c < Db; ++c) total += 4.0 * tg.g[1][1](m * Da + i, n * Db + c) * gcg(m * Mb + n, i * Db + c);
  // F1·G2 = 2 Σ g12[mb, nn'] Σ_a Ĝ_ab V2[ma, nn'];  F2·G1 = 2 Σ g21[mm', ne] Σ_c V[mm', nc] Ĝ'_ce.
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t i = 0; i < Da; ++i)
      for (int64_t col = 0; col < Mb * Mb; ++col) {
        double v = 0;
        for (int64_t a2 = 0; a2 < Da; ++a2) v += ga(a2, i) * s.V2(m * Da + a2, col);
        total += 2.0 * tg.g[1][2](m * Da + i, col) * v;
      }
  for (int64_t row = 0; row < Ma * Ma; ++row)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t e = 0; e < Db; ++e) {
        double v = 0;
        for (int64_t c = 0; c < Db; ++c) v += s.V(row, n * Db + c) * gb(c, e);
        total += 2.0 * tg.g[2][1](row, n * Db + e) * v;
      }
  // F2·G2 = Σ g22 ⊙ W.
  total += frobenius_inner(tg.g[2][2], s.W);
  return total;
}

}  // namespace

AttentionBlockCost attention_block_cost(const PolynomialView& a, const PolynomialView& b, int64_t features) {
  AttentionBlockCost c;
  if (!single_attention_block(a) || !single_attention_block(b)) return c;
  c.variables = features > 0 ? features : a.input_dim;
  const double k = double(c.variables), T = double(a.positions);
  auto shape = [](const PolynomialView& v) {  // d, M, classes
    const int64_t d = v.steps[0].weight.size(0), heads = v.steps[1].heads, dh = d / heads;
    return std::array<double, 3>{double(d), double(heads * dh * dh), double(v.steps[3].weight.size(0))};
  };
  const auto [da, ma, classes] = shape(a);
  const auto [db, mb, unused] = shape(b);
  (void)unused;
  const double p2 = binomial(int64_t(k) + 2, 2), p3 = binomial(int64_t(k) + 3, 3), p4 = binomial(int64_t(k) + 4, 4),
               p6 = binomial(int64_t(k) + 6, 6), p7 = binomial(int64_t(k) + 7, 7), p10 = binomial(int64_t(k) + 10, 10);
  const double pairs_a = ma * (ma + 1) / 2, pairs_b = mb * (mb + 1) / 2;
  // Per position t: the base polynomials' Gram matrices; per output and position u < T − 1:
  // the pairs κκ'·η, their Gram matrices (the largest term) and the moments' update.
  const double per_t = (da + 1) * (da + 1) * (db + 1) * (db + 1) * p10 + ma * (da + 1) * mb * (db + 1) * p7 +
                       ma * ma * mb * mb * p4 + (ma * ma + mb * mb) * p4 * p2;
  const double per_ou = (pairs_a + pairs_b) * p4 * p2 + pairs_a * pairs_b * p6 +
                        (pairs_a * mb * (db + 1) + ma * (da + 1) * pairs_b) * p3 + ma * ma * mb * mb * 2 * (da + db + 2) +
                        ma * mb * (da + 1) * (db + 1) * ma * mb;
  c.multiply_adds = T * per_t + classes * std::max(0.0, T - 1) * per_ou;
  c.held = T * ((da + 1) * (da + 1) * p10 + ma * (da + 1) * p7 + ma * ma * mb * mb * 2) + (pairs_a + pairs_b) * p6 +
           4 * ma * ma * mb * mb;
  return c;
}

std::vector<double> attention_block_output_inner(const PolynomialView& a, const PolynomialView& b, double input_std,
                                                 const Matrix64* basis) {
  check(input_std > 0 && std::isfinite(input_std), "attention block moments: the input's standard deviation must be positive, got ",
        input_std);
  const Matrix64 Q = basis ? *basis : Matrix64();
  const Side sa = prepare(a, input_std, Q), sb = prepare(b, input_std, Q);
  check(sa.T == sb.T && sa.k == sb.k && sa.classes == sb.classes, "attention block moments: ", a.arch, " and ", b.arch,
        " differ in their positions, inputs or outputs");
  std::vector<TermGrams> grams;
  for (int64_t t = 0; t < sa.T; ++t) grams.push_back(term_grams(position_terms(sa, t), position_terms(sb, t)));
  std::vector<double> out(size_t(sa.T * sa.classes));
  for (int64_t o = 0; o < sa.classes; ++o) {
    const Matrix64 &ga = sa.G[size_t(o)], &gb = sb.G[size_t(o)];
    Moments s(sa, sb);  // S = Σ_{u<t} X_u: empty at t = 0
    for (int64_t t = 0; t < sa.T; ++t) {
      out[size_t(t * sa.classes + o)] = output_inner(grams[size_t(t)], s, sa, sb, sa.form(t, o), sb.form(t, o));
      if (t + 1 < sa.T) s = absorb(s, position_moments(sa, sb, t, ga, gb), sa, sb, ga, gb);
    }
  }
  return out;
}

}  // namespace adjoint
