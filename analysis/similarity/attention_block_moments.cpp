#include "analysis/similarity/attention_block_moments.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>

#include "analysis/similarity/canonical_pairing.h"
#include "analysis/similarity/polynomial_moments.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

bool single_attention_block(const PolynomialView& v) {
  using K = PolynomialStep::Kind;
  return v.steps.size() == 4 && v.steps[0].kind == K::Linear && v.steps[1].kind == K::Attention &&
         v.steps[1].residual && plain_attention(v.steps[1]) && v.steps[2].kind == K::Bilinear && v.steps[2].residual && v.steps[3].kind == K::Linear;
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

// `read`: (input features, r), the side's variables y_t = readᵀx_t/σ (canonical_pairing.h).
Side prepare(const PolynomialView& v, double input_std, const Matrix64& read) {
  const PolynomialStep &embed = v.steps[0], &attention = v.steps[1], &mlp = v.steps[2], &head = v.steps[3];
  Side s;
  s.T = v.positions;
  s.k = read.cols;
  const Matrix64 W = matmul(to_matrix64(embed.weight), read);  // (d, r)
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
//   mean_a = E[S_ma], mean_b = E[S'_nc], form_a = E[S_mᵀĜS_m'], form_b = E[S'_nᵀĜ'S'_n'],
//   cross = E[S_ma S'_nc], form_a_with_b = E[(S_mᵀĜS_m') S'_nc], a_with_form_b = E[S_ma (S'_nᵀĜ'S'_n')].
// Rows and columns flatten (m, a) as m·(d+1) + a and (m, m') as m·M + m'. The fourth moment
// W = E[(S_mᵀĜS_m')(S'_nᵀĜ'S'_n')] is never held: it enters the outputs only through
// Σ_t ⟨g22_t, W_t⟩, so each position's share of it is contracted as it arises (position_share, absorb).
// mean_a, mean_b and cross do not depend on the output.
struct Moments {
  Matrix64 mean_a, mean_b;            // E[S_ma], E[S'_nc]
  Matrix64 form_a, form_b;            // E[S_mᵀĜS_m'], E[S'_nᵀĜ'S'_n']: each side's pairs through its own form
  Matrix64 cross;                     // E[S_ma S'_nc]
  Matrix64 form_a_with_b;             // E[(S_mᵀĜS_m') S'_nc]
  Matrix64 a_with_form_b;             // E[S_ma (S'_nᵀĜ'S'_n')]
  Moments() = default;
  Moments(const Side& a, const Side& b)
      : mean_a(a.M, a.D1()), mean_b(b.M, b.D1()), form_a(a.M, a.M), form_b(b.M, b.M), cross(a.M * a.D1(), b.M * b.D1()),
        form_a_with_b(a.M * a.M, b.M * b.D1()), a_with_form_b(a.M * a.D1(), b.M * b.M) {}
};

// The moments of one position's X that the output's form enters: form_a, form_b, form_a_with_b
// and a_with_form_b, as in Moments.
struct PairMoments {
  Matrix64 form_a, form_b, form_a_with_b, a_with_form_b;
};

// (Ĝ μ_m)_a for every m: a side's mean contracted with its form.
Matrix64 form_times_mean(const Matrix64& mean, const Matrix64& g) { return matmul(mean, g); }  // g symmetric

// cross's (d_a+1)×(d_b+1) block of each (m, n) as one row: rows (m, n), columns (i, c).
Matrix64 blocks_as_rows(const Matrix64& c, int64_t Ma, int64_t Mb, int64_t Da, int64_t Db) {
  Matrix64 r(Ma * Mb, Da * Db);
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t i = 0; i < Da; ++i)
        for (int64_t k = 0; k < Db; ++k) r(m * Mb + n, i * Db + k) = c(m * Da + i, n * Db + k);
  return r;
}

// Ĝ C_mn Ĝ' for every block of cross (Ĝ symmetric, so Ĝᵀ cross Ĝ' = Ĝ cross Ĝ'), laid out as blocks_as_rows:
// cross·(I ⊗ Ĝ') is one dgemm over cross's rows read as (m, i, n), then Ĝ times each m's block of rows.
Matrix64 sandwiched_blocks(const Matrix64& c, const Matrix64& ga, const Matrix64& gb, int64_t Ma, int64_t Mb) {
  const int64_t Da = ga.rows, Db = gb.rows;
  Matrix64 right = matmul(reshaped(c, Ma * Da * Mb, Db), gb);
  right.rows = Ma * Da, right.cols = Mb * Db;  // the same entries, cross's shape
  Matrix64 both(Ma * Da, Mb * Db);
  for (int64_t m = 0; m < Ma; ++m) {
    const Matrix64 block = matmul(ga, row_block(right, m * Da, Da));
    std::copy(block.data.begin(), block.data.end(), both.data.begin() + m * Da * Mb * Db);
  }
  return blocks_as_rows(both, Ma, Mb, Da, Db);
}

// The cross·cross terms of W's update below, W[mm', nn'] += P[(m,n),(m',n')] + P[(m,n'),(m',n)] + the
// transposes, contracted with G = Σ_{t>u} g22_t, are ⟨H, P⟩ with H[(m,n),(m',n')] = G[mm',nn'] +
// G[mm',n'n] + G[m'm,n'n] + G[m'm,nn']. P = T·C_Xᵀ, so ⟨H, P⟩ = ⟨T, H·C_X⟩ and H·C_X (C_X's blocks
// as rows) does not depend on the output: once a position.
Matrix64 cross_pair_weights(const Matrix64& g, int64_t Ma, int64_t Mb) {
  Matrix64 h(Ma * Mb, Ma * Mb);
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t m2 = 0; m2 < Ma; ++m2)
        for (int64_t n2 = 0; n2 < Mb; ++n2)
          h(m * Mb + n, m2 * Mb + n2) = g(m * Ma + m2, n * Mb + n2) + g(m * Ma + m2, n2 * Mb + n) + g(m2 * Ma + m, n2 * Mb + n) +
                                        g(m2 * Ma + m, n * Mb + n2);
  return h;
}

// S + X from the moments of S and of X, independent: every moment of the sum is the sum over
// which of its factors come from X (2^factors terms; factors of one kind give the same terms).
// Updates s (each moment after every term that reads its old value), and returns what the
// fourth moment's terms with factors from both add to the outputs: ⟨G, W_{S+X} − W_S − W_X⟩
// with G = Σ_{t>u} g22_t and `h_cx` = H·C_X (cross_pair_weights). X's means and cross are in `x`,
// the moments the output's form enters in `xp`.
double absorb(Moments& s, const Moments& x, const PairMoments& xp, const Side& a, const Side& b, const Matrix64& ga,
              const Matrix64& gb, const Matrix64& g, const Matrix64& h_cx) {
  const int64_t Ma = a.M, Mb = b.M, Da = a.D1(), Db = b.D1();
  const Matrix64 gmu_s = form_times_mean(s.mean_a, ga), gmu_x = form_times_mean(x.mean_a, ga);
  const Matrix64 gmu_bs = form_times_mean(s.mean_b, gb), gmu_bx = form_times_mean(x.mean_b, gb);
  // W: three factors from one and one from the other (form_a_with_b, a_with_form_b with a mean), a pair from each
  // (form_a·form_b, or cross·cross across the sides). With Y[(mm', n), n'] = Σ_c form_a_with_b[mm', nc]·(Ĝ'μ')_n'c (one
  // dgemm over form_a_with_b's rows read as (n, c)), form_a_with_b's terms are Y + Y exchanging n and n'; with
  // Z[m][m', nn'] = Σ_a (Ĝμ)_m'a·a_with_form_b[(m, a), nn'], a_with_form_b's are Z + Z exchanging m and m'.
  Matrix64 y = matmul(reshaped(s.form_a_with_b, Ma * Ma * Mb, Db), gmu_bx, false, true);
  const Matrix64 yx = matmul(reshaped(xp.form_a_with_b, Ma * Ma * Mb, Db), gmu_bs, false, true);
  for (size_t i = 0; i < y.data.size(); ++i) y.data[i] += yx.data[i];
  Matrix64 z(Ma * Ma, Mb * Mb);  // rows (m, m')
  for (int64_t m = 0; m < Ma; ++m) {
    const Matrix64 zs = matmul(gmu_x, row_block(s.a_with_form_b, m * Da, Da)), zx = matmul(gmu_s, row_block(xp.a_with_form_b, m * Da, Da));
    for (size_t i = 0; i < zs.data.size(); ++i) z.data[size_t(m * Ma * Mb * Mb) + i] = zs.data[i] + zx.data[i];
  }
  double cross = 0;
  const int64_t cols = Mb * Mb;
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t mm = 0; mm < Ma; ++mm) {
      const int64_t row = m * Ma + mm;
      const double *grow = &g.data[size_t(row * cols)], *z1 = &z.data[size_t(row * cols)], *z2 = &z.data[size_t((mm * Ma + m) * cols)];
      const double *yrow = &y.data[size_t(row * cols)], *bx = xp.form_b.data.data(), *bs = s.form_b.data.data();
      const double as = s.form_a(m, mm), ax = xp.form_a(m, mm);
      double sum = 0;
      for (int64_t n = 0; n < Mb; ++n)
        for (int64_t nn = 0; nn < Mb; ++nn) {
          const int64_t col = n * Mb + nn;
          sum += grow[col] * (as * bx[col] + ax * bs[col] + yrow[col] + yrow[nn * Mb + n] + z1[col] + z2[col]);
        }
      cross += sum;
    }
  // cross·cross: Σ Ĝ_ab Ĝ'_ce (C_S[ma,nc] C_X[m'b,n'e] + C_S[ma,n'e] C_X[m'b,nc]) and the same with S
  // and X exchanged. With T[(m,n),(b,e)] = (Ĝᵀ C_S,mn Ĝ')_be and P = T·C_Xᵀ over (b, e), the
  // exchanged terms are Pᵀ: ⟨H, P⟩ = ⟨T, H·C_X⟩ (cross_pair_weights).
  cross += frobenius_inner(sandwiched_blocks(s.cross, ga, gb, Ma, Mb), h_cx);

  // form_a_with_b = E[(S_mᵀĜS_m') S'_nc]: A's pair from one and the B factor from the other, or one of A's
  // pair with the B factor and the other alone: with U[(m,m'), nc] = Σ_i (Ĝμ_X)_m'i C_S[mi, nc] +
  // (Ĝμ_S)_m'i C_X[mi, nc] (a dgemm for each m), the last are U + U exchanging m and m'.
  Matrix64 u(Ma * Ma, Mb * Db);
  for (int64_t m = 0; m < Ma; ++m) {
    const Matrix64 us = matmul(gmu_x, row_block(s.cross, m * Da, Da)), ux = matmul(gmu_s, row_block(x.cross, m * Da, Da));
    for (size_t i = 0; i < us.data.size(); ++i) u.data[size_t(m * Ma * Mb * Db) + i] = us.data[i] + ux.data[i];
  }
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Ma; ++n) {
      double* v = &s.form_a_with_b.data[size_t((m * Ma + n) * Mb * Db)];
      const double *u1 = &u.data[size_t((m * Ma + n) * Mb * Db)], *u2 = &u.data[size_t((n * Ma + m) * Mb * Db)],
                   *vx = &xp.form_a_with_b.data[size_t((m * Ma + n) * Mb * Db)];
      const double as = s.form_a(m, n), ax = xp.form_a(m, n);
      for (int64_t j = 0; j < Mb * Db; ++j) v[j] += as * x.mean_b.data[size_t(j)] + ax * s.mean_b.data[size_t(j)] + u1[j] + u2[j] + vx[j];
    }
  // a_with_form_b likewise, with U2[(i, m), n] = Σ_c C_S[i, mc] (Ĝ'μ'_X)_nc + C_X[i, mc] (Ĝ'μ'_S)_nc.
  Matrix64 u2 = matmul(reshaped(s.cross, Ma * Da * Mb, Db), gmu_bx, false, true);
  const Matrix64 u2x = matmul(reshaped(x.cross, Ma * Da * Mb, Db), gmu_bs, false, true);
  for (size_t i = 0; i < u2.data.size(); ++i) u2.data[i] += u2x.data[i];
  for (int64_t i = 0; i < Ma * Da; ++i) {
    double* v = &s.a_with_form_b.data[size_t(i * Mb * Mb)];
    const double *w = &u2.data[size_t(i * Mb * Mb)], *vx = &xp.a_with_form_b.data[size_t(i * Mb * Mb)];
    const double ms = s.mean_a.data[size_t(i)], mx = x.mean_a.data[size_t(i)];
    for (int64_t m = 0; m < Mb; ++m)
      for (int64_t n = 0; n < Mb; ++n) {
        const int64_t col = m * Mb + n;
        v[col] += ms * xp.form_b.data[size_t(col)] + mx * s.form_b.data[size_t(col)] + w[col] + w[n * Mb + m] + vx[col];
      }
  }
  // cross: the A factor from one, the B factor from the other.
  for (int64_t i = 0; i < Ma * Da; ++i)
    for (int64_t j = 0; j < Mb * Db; ++j)
      s.cross(i, j) += s.mean_a.data[size_t(i)] * x.mean_b.data[size_t(j)] + x.mean_a.data[size_t(i)] * s.mean_b.data[size_t(j)] + x.cross(i, j);
  // form_a and form_b: one factor from each.
  const Matrix64 da = matmul(s.mean_a, gmu_x, false, true), dax = matmul(x.mean_a, gmu_s, false, true);
  const Matrix64 db = matmul(s.mean_b, gmu_bx, false, true), dbx = matmul(x.mean_b, gmu_bs, false, true);
  for (size_t i = 0; i < s.form_a.data.size(); ++i) s.form_a.data[i] += da.data[i] + dax.data[i] + xp.form_a.data[i];
  for (size_t i = 0; i < s.form_b.data.size(); ++i) s.form_b.data[i] += db.data[i] + dbx.data[i] + xp.form_b.data[i];
  for (size_t i = 0; i < s.mean_a.data.size(); ++i) s.mean_a.data[i] += x.mean_a.data[i];
  for (size_t i = 0; i < s.mean_b.data.size(); ++i) s.mean_b.data[i] += x.mean_b.data[i];
  return cross;
}

// G = Σ_{t>u} g22_t, (M_A², M_B²), folded onto the pairs k = (m ≤ m') and l = (n ≤ n') of each
// side: G_kl = Σ over both orders of k and of l (one order where m = m').
Matrix64 fold_onto_pairs(const Matrix64& g, const Side& a, const Side& b) {
  Matrix64 f(int64_t(a.pairs.size()), int64_t(b.pairs.size()));
  for (size_t k = 0; k < a.pairs.size(); ++k) {
    const auto [m, m2] = a.pairs[k];
    for (size_t l = 0; l < b.pairs.size(); ++l) {
      const auto [n, n2] = b.pairs[l];
      double v = g(m * a.M + m2, n * b.M + n2);
      if (n != n2) v += g(m * a.M + m2, n2 * b.M + n);
      if (m != m2) v += g(m2 * a.M + m, n * b.M + n2) + (n != n2 ? g(m2 * a.M + m, n2 * b.M + n) : 0.0);
      f(int64_t(k), int64_t(l)) = v;
    }
  }
  return f;
}

// The heads e = h·heads + h' of a side's pair k = (m ≤ m').
int64_t heads_of(const Side& s, size_t k) {
  const int64_t per_head = s.dh * s.dh;
  return (s.pairs[k].first / per_head) * s.heads + s.pairs[k].second / per_head;
}

// The output's form enters X_u's pairs only through η_hh' = ν_hᵀĜν_h', a polynomial of degree 2:
// P_k = κκ_k·η_e(k) = Σ_β η̂_e,β·(He_β·κκ_k) with η̂ its Hermite coefficients (the basis of
// degree ≤ 2, `basis`). So what X_u's pairs give every output is linear (means, form_a_with_b, a_with_form_b) or
// bilinear (the fourth moment) in the two sides' η̂, over products He_β·κκ_k that do not depend
// on the output: built once a position, here.
struct PositionFacts {
  Moments own;                        // X_u's means and cross alone (the rest is the output's: PairMoments)
  Matrix64 truncated_a, truncated_b;  // rows k·|basis| + j: He_βj·κκ_k to degree 3, Hermite basis
  // Σ_{t>u} ⟨g22_t, W of X_u alone⟩ = η̂_Aᵀ·θ·η̂_B, θ[(e, j), (e', j')] = Σ_{k of heads e}
  // E[He_βj κκ_k · He_βj' Λ_e',k] with Λ_e',k = Σ_{l of heads e'} G_kl·κκ'_l (G folded onto pairs).
  Matrix64 theta;
  Matrix64 after, h_cx;  // G_u = Σ_{t>u} g22_t, and H·C_X (cross_pair_weights)
};

Matrix64 truncated_products(const std::vector<Poly>& kk, const std::vector<std::vector<int>>& basis) {
  const int64_t width = int64_t(at_degree(kk.front(), 3).coefficients.size());
  Matrix64 r(int64_t(kk.size() * basis.size()), width);
  for (size_t k = 0; k < kk.size(); ++k)
    for (size_t j = 0; j < basis.size(); ++j) {
      const Poly p = at_degree(hermite_times(kk[k], basis[j]), 3);
      std::copy(p.coefficients.begin(), p.coefficients.end(), r.data.begin() + int64_t(k * basis.size() + j) * width);
    }
  return r;
}

Matrix64 fourth_moment_form(const Matrix64& folded, const std::vector<Poly>& kk_a, const std::vector<Poly>& kk_b,
                            const Side& a, const Side& b, const std::vector<std::vector<int>>& basis,
                            const std::vector<double>& rho) {
  const int64_t nb = int64_t(basis.size()), ea = a.heads * a.heads, eb = b.heads * b.heads;
  const int64_t width = int64_t(kk_b.front().coefficients.size());
  // Λ_e' = G[:, l of heads e'] · κκ'[l of heads e'], rows A's pairs (Hermite, degree 4).
  std::vector<Matrix64> lambda(static_cast<size_t>(eb));
  for (int64_t e = 0; e < eb; ++e) {
    std::vector<int64_t> of_e;
    for (size_t l = 0; l < b.pairs.size(); ++l)
      if (heads_of(b, l) == e) of_e.push_back(int64_t(l));
    if (of_e.empty()) continue;
    Matrix64 g(folded.rows, int64_t(of_e.size())), rows(int64_t(of_e.size()), width);
    for (size_t j = 0; j < of_e.size(); ++j) {
      for (int64_t k = 0; k < folded.rows; ++k) g(k, int64_t(j)) = folded(k, of_e[j]);
      const Poly& p = kk_b[size_t(of_e[j])];
      std::copy(p.coefficients.begin(), p.coefficients.end(), rows.data.begin() + int64_t(j) * width);
    }
    lambda[size_t(e)] = matmul(g, rows);
  }
  const int top = 4 + 2;  // κκ (4) times He_β (≤ 2)
  Matrix64 theta(ea * nb, eb * nb);
  for (size_t k = 0; k < kk_a.size(); ++k) {
    std::vector<Poly> left, right;
    for (const auto& beta : basis) left.push_back(at_degree(hermite_times(kk_a[k], beta), top));
    std::vector<int64_t> columns;  // θ's columns the right side fills
    for (int64_t e = 0; e < eb; ++e) {
      if (lambda[size_t(e)].rows == 0) continue;
      const Matrix64& l = lambda[size_t(e)];
      const Poly row{b.k, 4, std::vector<double>(l.data.begin() + int64_t(k) * l.cols, l.data.begin() + int64_t(k + 1) * l.cols)};
      for (int64_t j = 0; j < nb; ++j) {
        right.push_back(at_degree(hermite_times(row, basis[size_t(j)]), top));
        columns.push_back(e * nb + j);
      }
    }
    const Matrix64 gram = hermite_gram(left, right, rho);
    const int64_t first_row = heads_of(a, k) * nb;
    for (int64_t i = 0; i < nb; ++i)
      for (size_t j = 0; j < columns.size(); ++j) theta(first_row + i, columns[j]) += gram(i, int64_t(j));
  }
  return theta;
}

PositionFacts position_facts(const Side& a, const Side& b, const std::vector<double>& rho, int64_t u,
                             Matrix64 after, const std::vector<std::vector<int>>& basis) {
  PositionFacts f{{}, {}, {}, {}, std::move(after), {}};
  f.own.mean_a = Matrix64(a.M, a.D1()), f.own.mean_b = Matrix64(b.M, b.D1());
  const std::vector<Poly> &xa = a.X_hermite[size_t(u)], &xb = b.X_hermite[size_t(u)];
  for (int64_t i = 0; i < a.M * a.D1(); ++i) f.own.mean_a.data[size_t(i)] = xa[size_t(i)].coefficients[0];
  for (int64_t i = 0; i < b.M * b.D1(); ++i) f.own.mean_b.data[size_t(i)] = xb[size_t(i)].coefficients[0];
  f.own.cross = hermite_gram(xa, xb, rho);
  std::vector<Poly> kk_a, kk_b;
  for (const Poly& p : a.kappa_pairs[size_t(u)]) kk_a.push_back(at_degree(to_hermite(p), 4));
  for (const Poly& p : b.kappa_pairs[size_t(u)]) kk_b.push_back(at_degree(to_hermite(p), 4));
  f.truncated_a = truncated_products(kk_a, basis);
  f.truncated_b = truncated_products(kk_b, basis);
  f.theta = fourth_moment_form(fold_onto_pairs(f.after, a, b), kk_a, kk_b, a, b, basis, rho);
  f.h_cx = matmul(cross_pair_weights(f.after, a.M, b.M), blocks_as_rows(f.own.cross, a.M, b.M, a.D1(), b.D1()));
  return f;
}

// η̂ of a side for one output: rows e = h·heads + h', the Hermite coefficients of ν_hᵀĜν_h'.
Matrix64 eta_coefficients(const Side& s, int64_t u, const Matrix64& g, int64_t basis_size) {
  const std::vector<Poly>& nu = s.nu[size_t(u)];
  Matrix64 r(s.heads * s.heads, basis_size);
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t h2 = 0; h2 < s.heads; ++h2) {
      Poly e = constant(s.k, 0.0);
      for (int64_t i = 0; i < s.d; ++i)
        for (int64_t j = 0; j < s.d; ++j)
          if (g(1 + i, 1 + j) != 0.0) accumulate_product(e, nu[size_t(h * s.d + i)], nu[size_t(h2 * s.d + j)], g(1 + i, 1 + j));
      const Poly hat = at_degree(to_hermite(std::move(e)), 2);
      std::copy(hat.coefficients.begin(), hat.coefficients.end(), r.data.begin() + (h * s.heads + h2) * basis_size);
    }
  return r;
}

// One position u's X_u for the output o: its moments, and the share of its own fourth moment
// in the later outputs, all from its facts and the two sides' η̂.
struct PositionShare {
  PairMoments x;
  double fourth = 0;  // Σ_{t>u} ⟨g22_t, W of X_u alone⟩
};
PositionShare position_share(const Side& a, const Side& b, const std::vector<double>& rho, int64_t u,
                             const PositionFacts& facts, const Matrix64& ga, const Matrix64& gb, int64_t basis_size) {
  PositionShare r{{Matrix64(a.M, a.M), Matrix64(b.M, b.M), Matrix64(a.M * a.M, b.M * b.D1()), Matrix64(a.M * a.D1(), b.M * b.M)},
                  0.0};
  PairMoments& x = r.x;
  const Matrix64 eta_a = eta_coefficients(a, u, ga, basis_size), eta_b = eta_coefficients(b, u, gb, basis_size);
  // P_k to degree 3 (all that its mean, form_a_with_b and a_with_form_b read): Σ_j η̂_e(k),j · (He_βj·κκ_k).
  auto pairs_to_degree_3 = [&](const Side& s, const Matrix64& eta, const Matrix64& truncated, Matrix64& mean) {
    std::vector<Poly> p;
    for (size_t k = 0; k < s.pairs.size(); ++k) {
      Poly q{s.k, 3, std::vector<double>(size_t(truncated.cols), 0.0)};
      const int64_t e = heads_of(s, k);
      for (int64_t j = 0; j < basis_size; ++j) {
        const double w = eta(e, j);
        if (w == 0.0) continue;
        const double* row = &truncated.data[size_t((int64_t(k) * basis_size + j) * truncated.cols)];
        for (int64_t i = 0; i < truncated.cols; ++i) q.coefficients[size_t(i)] += w * row[i];
      }
      const auto [m, n] = s.pairs[k];
      mean(m, n) = mean(n, m) = q.coefficients[0];
      p.push_back(std::move(q));
    }
    return p;
  };
  const std::vector<Poly> pa = pairs_to_degree_3(a, eta_a, facts.truncated_a, x.form_a),
                          pb = pairs_to_degree_3(b, eta_b, facts.truncated_b, x.form_b);
  const std::vector<Poly> &xa = a.X_hermite[size_t(u)], &xb = b.X_hermite[size_t(u)];
  // Gram matrices over the pairs, spread to both orders of each.
  const Matrix64 v = hermite_gram(pa, xb, rho), v2 = hermite_gram(xa, pb, rho);
  for (size_t k = 0; k < a.pairs.size(); ++k) {
    const auto [m, n] = a.pairs[k];
    for (int64_t j = 0; j < v.cols; ++j) x.form_a_with_b(m * a.M + n, j) = x.form_a_with_b(n * a.M + m, j) = v(int64_t(k), j);
  }
  for (size_t l = 0; l < b.pairs.size(); ++l) {
    const auto [p, q] = b.pairs[l];
    for (int64_t i = 0; i < v2.rows; ++i) x.a_with_form_b(i, p * b.M + q) = x.a_with_form_b(i, q * b.M + p) = v2(i, int64_t(l));
  }
  // The fourth moment: η̂_Aᵀ·θ·η̂_B over (heads, basis) rows and columns.
  for (int64_t row = 0; row < facts.theta.rows; ++row) {
    const double left = eta_a.data[size_t(row)];
    if (left == 0.0) continue;
    double sum = 0;
    for (int64_t col = 0; col < facts.theta.cols; ++col) sum += facts.theta(row, col) * eta_b.data[size_t(col)];
    r.fourth += left * sum;
  }
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
TermGrams term_grams(const Terms& a, const Terms& b, const std::vector<double>& rho) {
  TermGrams r;
  const std::vector<Poly>* ta[3] = {&a.b0, &a.b1, &a.b2};
  const std::vector<Poly>* tb[3] = {&b.b0, &b.b1, &b.b2};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r.g[i][j] = hermite_gram(*ta[i], *tb[j], rho);
  return r;
}

// E[f_t,o · g_t,o] from the position's Grams, the two forms and the moments of S, but for the
// fourth moment's term ⟨g22, W⟩.
double output_inner(const TermGrams& tg, const Moments& s, const Side& a, const Side& b, const Matrix64& ga,
                    const Matrix64& gb) {
  const int64_t Ma = a.M, Mb = b.M, Da = a.D1(), Db = b.D1();
  // Each side's coefficients over its base polynomials: F0 = Σ Ĝ_ab B0_ab, F1_ma = 2 Σ_b Ĝ_ab B1_mb.
  const Matrix64 gmu = form_times_mean(s.mean_a, ga), gmu_b = form_times_mean(s.mean_b, gb);
  double total = 0;
  // F0·G0, F0·G1, F0·G2: Σ_ab Ĝ_ab E[B0_ab ·] against G's coefficients.
  auto b_side = [&](int64_t j, int64_t col) {  // the coefficient of B's base polynomial `col` of kind j in E_S[g]
    if (j == 0) return gb.data[size_t(col)];                    // G0 = Σ Ĝ'_ce B0'_ce
    if (j == 1) return 2.0 * gmu_b.data[size_t(col)];           // Σ_nc G1_nc μ'_nc = 2 Σ_ne B1'_ne (Ĝ'μ'_n)_e
    return s.form_b.data[size_t(col)];                               // Σ G2_nn' A'_nn'
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
    for (int64_t row = 0; row < Ma * Ma; ++row) total += s.form_a.data[size_t(row)] * tg.g[2][0](row, col) * w;
  }
  // F1·G1 = 4 Σ g11[mb,ne] (Ĝ C_mn Ĝ')_be.
  const Matrix64 gcg = sandwiched_blocks(s.cross, ga, gb, Ma, Mb);
  for (int64_t m = 0; m < Ma; ++m)
    for (int64_t n = 0; n < Mb; ++n)
      for (int64_t i = 0; i < Da; ++i)
        for (int64_t c = 0; c < Db; ++c) total += 4.0 * tg.g[1][1](m * Da + i, n * Db + c) * gcg(m * Mb + n, i * Db + c);
  // F1·G2 = 2 Σ g12[mb, nn'] Σ_a Ĝ_ab a_with_form_b[ma, nn'] (Ĝ times each m's rows of a_with_form_b);
  // F2·G1 = 2 Σ g21[mm', ne] Σ_c form_a_with_b[mm', nc] Ĝ'_ce (one dgemm over form_a_with_b's rows read as (mm', n)).
  for (int64_t m = 0; m < Ma; ++m)
    total += 2.0 * frobenius_inner(row_block(tg.g[1][2], m * Da, Da), matmul(ga, row_block(s.a_with_form_b, m * Da, Da)));
  total += 2.0 * frobenius_inner(reshaped(tg.g[2][1], Ma * Ma * Mb, Db), matmul(reshaped(s.form_a_with_b, Ma * Ma * Mb, Db), gb));
  // F2·G2 = ⟨g22, W⟩ is added as W's terms arise (position_share, absorb).
  return total;
}

}  // namespace

AttentionBlockCost attention_block_cost(const PolynomialView& a, const PolynomialView& b) {
  AttentionBlockCost c;
  if (!single_attention_block(a) || !single_attention_block(b)) return c;
  // Each side in at most its embedding's rank of variables (canonical_pairing.h).
  c.variables = std::max(std::min(a.steps[0].weight.size(0), a.input_dim), std::min(b.steps[0].weight.size(0), b.input_dim));
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
  const double pairs_a = ma * (ma + 1) / 2, pairs_b = mb * (mb + 1) / 2, heads_a = double(a.steps[1].heads),
               heads_b = double(b.steps[1].heads);
  const double Da = da + 1, Db = db + 1;
  // Per position t: its base polynomials' Gram matrices. Per position u < T − 1, what no output
  // changes: θ (the largest term: a Gram matrix of He_β·κκ_k against He_β'·Λ_e',k for every
  // pair k), Λ, H·C_X and cross. Per output and u: form_a_with_b and a_with_form_b (Gram matrices to degree 3), the
  // pairs' truncations and the moments' update; per output and t: the outputs' terms.
  const double per_t = Da * Da * Db * Db * p10 + ma * Da * mb * Db * p7 + ma * ma * mb * mb * p4 + (ma * ma + mb * mb) * p4 * p2;
  const double per_u = pairs_a * p2 * p2 * heads_b * heads_b * p6 + pairs_a * pairs_b * p4 + ma * mb * ma * mb * Da * Db +
                       ma * Da * mb * Db * p3;
  const double per_ou = (pairs_a * mb * Db + ma * Da * pairs_b) * p3 + (pairs_a + pairs_b) * p2 * p3 + 10 * ma * ma * mb * mb +
                        4 * ma * ma * Da * mb * Db + ma * mb * Da * Db * (Da + Db);
  const double per_ot = ma * ma * mb * Db * Db + ma * Da * Da * mb * mb + ma * mb * Da * Db * (Da + Db);
  const double earlier = std::max(0.0, T - 1);
  c.multiply_adds = T * per_t + earlier * per_u + classes * (earlier * per_ou + T * per_ot);
  // Held: every position's Grams, each u's facts (truncations, G_u, θ, H·C_X, cross), and while a
  // position's Grams are made, its base polynomials (counted once, so that the route chosen does
  // not depend on the thread count; each thread making a position's Grams holds its own).
  const double grams = (Da * Da + ma * Da + ma * ma) * (Db * Db + mb * Db + mb * mb);
  const double base_polynomials = Da * Da * p10 + ma * Da * p7 + ma * ma * p4 + Db * Db * p10 + mb * Db * p7 + mb * mb * p4;
  c.held = T * grams + base_polynomials +
           earlier * ((pairs_a + pairs_b) * p2 * p3 + ma * ma * mb * mb + heads_a * heads_a * heads_b * heads_b * p2 * p2 +
                      2 * ma * mb * Da * Db);
  return c;
}

std::vector<double> attention_block_class_inner(const PolynomialView& a, const PolynomialView& b, double input_std,
                                                const std::function<void(int64_t, int64_t)>& progress) {
  check(input_std > 0 && std::isfinite(input_std), "attention block moments: the input's standard deviation must be positive, got ",
        input_std);
  check(single_attention_block(a) && single_attention_block(b), "attention block moments: ", a.arch, " or ", b.arch,
        " is not one block of embedding, polynomial attention, bilinear MLP and head");
  check(a.input_dim == b.input_dim, "attention block moments: ", a.arch, " and ", b.arch, " read ", a.input_dim, " and ",
        b.input_dim, " input features a position");
  // Each side in its own embedding's variables, the two paired by their canonical correlations.
  const CanonicalPairing pairing = canonical_pairing(to_matrix64(a.steps[0].weight), to_matrix64(b.steps[0].weight));
  const std::vector<double>& rho = pairing.correlation;
  const Side sa = prepare(a, input_std, pairing.read_a), sb = prepare(b, input_std, pairing.read_b);
  check(sa.T == sb.T && sa.classes == sb.classes, "attention block moments: ", a.arch, " and ", b.arch,
        " differ in their positions or outputs");
  const int64_t T = sa.T;
  // What no output changes: each position's Grams, and for each u < T − 1, G_u = Σ_{t>u} g22_t
  // and X_u's facts (PositionFacts).
  std::vector<TermGrams> grams(static_cast<size_t>(T));
  parallel_for(T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) grams[size_t(t)] = term_grams(position_terms(sa, t), position_terms(sb, t), rho);
  });
  std::vector<Matrix64> after(size_t(std::max<int64_t>(T - 1, 0)));
  for (int64_t u = T - 2; u >= 0; --u) {
    after[size_t(u)] = grams[size_t(u + 1)].g[2][2];
    if (u + 2 < T)
      for (size_t i = 0; i < after[size_t(u)].data.size(); ++i) after[size_t(u)].data[i] += after[size_t(u + 1)].data[i];
  }
  const std::vector<std::vector<int>> basis = layout_exponents(sa.k, 2);  // He_β, |β| ≤ 2
  const int64_t nb = int64_t(basis.size());
  std::vector<PositionFacts> facts(after.size());
  parallel_for(int64_t(after.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) facts[size_t(u)] = position_facts(sa, sb, rho, u, std::move(after[size_t(u)]), basis);
  });
  std::vector<double> out(size_t(sa.classes));
  std::mutex reporting;
  int64_t done = 0;
  parallel_for(sa.classes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const Matrix64 &ga = sa.G[size_t(o)], &gb = sb.G[size_t(o)];
      Moments s(sa, sb);  // S = Σ_{u<t} X_u: empty at t = 0
      double total = 0;
      for (int64_t t = 0; t < T; ++t) {
        total += output_inner(grams[size_t(t)], s, sa, sb, sa.form(t, o), sb.form(t, o));
        if (t + 1 == T) break;
        const PositionFacts& f = facts[size_t(t)];
        const PositionShare x = position_share(sa, sb, rho, t, f, ga, gb, nb);
        total += x.fourth + absorb(s, f.own, x.x, sa, sb, ga, gb, f.after, f.h_cx);
      }
      out[size_t(o)] = total;
      if (progress) {
        const std::lock_guard<std::mutex> lock(reporting);
        progress(++done, sa.classes);
      }
    }
  });
  return out;
}

}  // namespace adjoint
