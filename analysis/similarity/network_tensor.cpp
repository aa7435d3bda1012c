#include "analysis/similarity/network_tensor.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

// The state z̃ = (1, h_1, …, h_T) of `width` features a position: coordinate 0 is the constant.
int64_t state_size(int64_t positions, int64_t width) { return 1 + positions * width; }
int64_t coordinate(int64_t width, int64_t t, int64_t i) { return 1 + t * width + i; }

// A linear step as one matrix of the whole state (block diagonal over positions, the bias in
// column 0, the constant kept).
Matrix64 linear_map(const PolynomialStep& s, int64_t positions, int64_t in) {
  const Matrix64 w = to_matrix64(s.weight);
  const Matrix64 bias = s.bias.defined() ? to_matrix64(s.bias) : Matrix64();  // (1, out) or (T, out)
  const int64_t out = w.rows;
  Matrix64 m(state_size(positions, out), state_size(positions, in));
  m(0, 0) = 1;
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t o = 0; o < out; ++o) {
      const int64_t row = coordinate(out, t, o);
      if (bias.rows) m(row, 0) = bias(bias.rows == 1 ? 0 : t, o);
      for (int64_t i = 0; i < in; ++i) m(row, coordinate(in, t, i)) = w(o, i);
    }
  return m;
}

// A bilinear step as units: output k = Σ_u coef[k,u] (left_u·z̃)(right_u·z̃). The constant is the
// unit (e_0·z̃)(e_0·z̃); a residual's identity path h_i the unit (e_i·z̃)(e_0·z̃).
struct BilinearUnits {
  Matrix64 left, right;  // (units, state)
  Matrix64 coef;         // (next state, units)
};

BilinearUnits bilinear_units(const PolynomialStep& s, int64_t positions, int64_t in) {
  const Matrix64 l = to_matrix64(s.left), r = to_matrix64(s.right);
  const int64_t H = l.rows;
  const Matrix64 down = s.down.defined() ? to_matrix64(s.down) : Matrix64::identity(H);
  const int64_t out = s.residual ? in : down.rows;
  check(!s.residual || down.rows == in, "network tensor: residual layer '", s.name, "' maps ", in, " features to ", down.rows);
  const int64_t units = 1 + positions * H + (s.residual ? positions * in : 0);
  const double scale = s.residual ? s.scale : 1.0;
  BilinearUnits u{Matrix64(units, state_size(positions, in)), Matrix64(units, state_size(positions, in)),
                  Matrix64(state_size(positions, out), units)};
  u.left(0, 0) = u.right(0, 0) = u.coef(0, 0) = 1;
  for (int64_t t = 0; t < positions; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t unit = 1 + t * H + h;
      u.left(unit, 0) = l(h, 0), u.right(unit, 0) = r(h, 0);
      for (int64_t i = 0; i < in; ++i)
        u.left(unit, coordinate(in, t, i)) = l(h, 1 + i), u.right(unit, coordinate(in, t, i)) = r(h, 1 + i);
      for (int64_t o = 0; o < down.rows; ++o) u.coef(coordinate(out, t, o), unit) = scale * down(o, h);
    }
    if (s.residual)
      for (int64_t i = 0; i < in; ++i) {
        const int64_t unit = 1 + positions * H + t * in + i;
        u.left(unit, coordinate(in, t, i)) = 1, u.right(unit, 0) = 1;
        u.coef(coordinate(in, t, i), unit) = 1;
      }
  }
  return u;
}

// The next Gram matrix: Σ_{u,u'} coef_a[k,u] coef_b[k',u'] ½(⟨l_u,l'_u'⟩⟨r_u,r'_u'⟩ + ⟨l_u,r'_u'⟩⟨r_u,l'_u'⟩),
// each ⟨p, p'⟩ = p·G·p'ᵀ.
Matrix64 bilinear_gram(const BilinearUnits& a, const BilinearUnits& b, const Matrix64& g) {
  const Matrix64 lg = matmul(a.left, g), rg = matmul(a.right, g);
  const Matrix64 ll = matmul(lg, b.left, false, true), rr = matmul(rg, b.right, false, true);
  const Matrix64 lr = matmul(lg, b.right, false, true), rl = matmul(rg, b.left, false, true);
  Matrix64 core(ll.rows, ll.cols);
  for (size_t i = 0; i < core.data.size(); ++i) core.data[i] = 0.5 * (ll.data[i] * rr.data[i] + lr.data[i] * rl.data[i]);
  return matmul(matmul(a.coef, core), b.coef, false, true);
}

// The attention step's legs: per position, the five parts (q1, k1, q2, k2, v) as (dim, state)
// matrices, and what multiplies a term: proj, and scale/d_head².
enum Part { kQ1, kK1, kQ2, kK2, kV };
struct AttentionLegs {
  int64_t positions = 0, dim = 0, heads = 0, head_dim = 0;
  std::vector<std::array<Matrix64, 5>> legs;
  Matrix64 proj;
  double coef = 0;
};

AttentionLegs attention_legs(const PolynomialStep& s, int64_t positions, int64_t dim) {
  check(s.residual, "network tensor: attention '", s.name, "' without a residual is not a layer of the bilinear LM");
  check(plain_attention(s), "network tensor: attention '", s.name, "' has QK biases or rotary positions, which this route does not take");
  const Matrix64 qkv = to_matrix64(s.qkv);
  AttentionLegs a;
  a.positions = positions, a.dim = dim, a.heads = s.heads, a.head_dim = dim / s.heads;
  a.proj = to_matrix64(s.proj);
  a.coef = s.scale / double(a.head_dim * a.head_dim);
  a.legs.resize(size_t(positions));
  for (int64_t t = 0; t < positions; ++t)
    for (int p = 0; p < 5; ++p) {
      Matrix64 leg(dim, state_size(positions, dim));
      for (int64_t r = 0; r < dim; ++r)
        for (int64_t i = 0; i < dim; ++i) leg(r, coordinate(dim, t, i)) = qkv(p * dim + r, i);
      a.legs[size_t(t)][size_t(p)] = std::move(leg);
    }
  return a;
}

// out[rows r0.., cols c0..] += c · x[xr0.., xc0..] · m · yᵀ[.., yc0..]: P_a[:, head] · M · P_b[:, head']ᵀ.
void add_projected(Matrix64& out, int64_t r0, int64_t c0, const Matrix64& pa, int64_t ha, const Matrix64& m,
                   const Matrix64& pb, int64_t hb) {
  const Matrix64 left = matmul(columns(pa, ha, ha + m.rows), m);  // (dim_a, dh_b)
  const Matrix64 block = matmul(left, columns(pb, hb, hb + m.cols), false, true);
  for (int64_t i = 0; i < block.rows; ++i)
    for (int64_t j = 0; j < block.cols; ++j) out(r0 + i, c0 + j) += block(i, j);
}

// One side's attention terms against the other side's identity path and constant (whose legs
// are e_k' and four e_0, symmetric under the swap): rows of the result are the attention's
// outputs (t, j) over `a`, columns every coordinate of the other state. `g` is ⟨z̃_a | z̃_b⟩.
Matrix64 attention_against_identity(const AttentionLegs& a, const Matrix64& g) {
  const int64_t T = a.positions, dh = a.head_dim;
  Matrix64 out(state_size(T, a.dim), g.cols);
  // ⟨leg, e_0⟩ for every leg: leg·G[:, 0].
  std::vector<std::array<std::vector<double>, 5>> with_constant(static_cast<size_t>(T));
  std::vector<Matrix64> value_g(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    for (int p = 0; p < 5; ++p) {
      std::vector<double>& v = with_constant[size_t(t)][size_t(p)];
      v.assign(size_t(a.dim), 0.0);
      for (int64_t r = 0; r < a.dim; ++r)
        for (int64_t c = 0; c < g.rows; ++c) v[size_t(r)] += a.legs[size_t(t)][size_t(p)](r, c) * g(c, 0);
    }
    value_g[size_t(t)] = matmul(a.legs[size_t(t)][kV], g);  // (dim, other state)
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t u = 0; u <= t; ++u)
      for (int64_t head = 0; head < a.heads; ++head) {
        double x1 = 0, x2 = 0;
        for (int64_t i = head * dh; i < (head + 1) * dh; ++i) {
          x1 += with_constant[size_t(t)][kQ1][size_t(i)] * with_constant[size_t(u)][kK1][size_t(i)];
          x2 += with_constant[size_t(t)][kQ2][size_t(i)] * with_constant[size_t(u)][kK2][size_t(i)];
        }
        const double c = a.coef * x1 * x2;
        if (c == 0) continue;
        // P[:, head] · (c · (v_u G)[head rows, :]) into rows (t, ·).
        Matrix64 vg(dh, g.cols);
        for (int64_t i = 0; i < dh; ++i)
          for (int64_t k = 0; k < g.cols; ++k) vg(i, k) = c * value_g[size_t(u)](head * dh + i, k);
        const Matrix64 block = matmul(columns(a.proj, head * dh, (head + 1) * dh), vg);
        for (int64_t j = 0; j < a.dim; ++j)
          for (int64_t k = 0; k < g.cols; ++k) out(coordinate(a.dim, t, j), k) += block(j, k);
      }
  return out;
}

Matrix64 attention_gram(const AttentionLegs& a, const AttentionLegs& b, const Matrix64& g) {
  check(a.positions == b.positions, "network tensor: attention over ", a.positions, " and ", b.positions, " positions");
  const int64_t T = a.positions, dha = a.head_dim, dhb = b.head_dim;
  // The identity paths and constants: every leg e_0 but one.
  const double g00 = g(0, 0), g4 = g00 * g00 * g00 * g00;
  Matrix64 out = g;
  for (double& v : out.data) v *= g4;
  // Attention against the other's identity path, both ways.
  const Matrix64 ab = attention_against_identity(a, g);
  const Matrix64 ba = attention_against_identity(b, transpose(g));
  for (int64_t i = 0; i < out.rows; ++i)
    for (int64_t j = 0; j < out.cols; ++j) out(i, j) += ab(i, j) + ba(j, i);
  // Attention against attention: the leg Grams ⟨part p of a at t | part p' of b at t'⟩.
  std::vector<std::array<Matrix64, 5>> lg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    for (int p = 0; p < 5; ++p) lg[size_t(t)][size_t(p)] = matmul(a.legs[size_t(t)][size_t(p)], g);
  auto leg_gram = [&](int64_t t, int pa, int64_t tb, int pb) {
    return matmul(lg[size_t(t)][size_t(pa)], b.legs[size_t(tb)][size_t(pb)], false, true);
  };
  // Pairs (p, p'): the direct pairing and the swapped one (k1↔k2, q1↔q2 on one side).
  const std::array<std::pair<int, int>, 9> pairs = {{{kQ1, kQ1}, {kK1, kK1}, {kQ2, kQ2}, {kK2, kK2}, {kQ1, kQ2},
                                                     {kK1, kK2}, {kQ2, kQ1}, {kK2, kK1}, {kV, kV}}};
  std::vector<std::vector<std::array<Matrix64, 9>>> grams(static_cast<size_t>(T),
                                                          std::vector<std::array<Matrix64, 9>>(static_cast<size_t>(T)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t tb = 0; tb < T; ++tb)
      for (size_t k = 0; k < pairs.size(); ++k) grams[size_t(t)][size_t(tb)][k] = leg_gram(t, pairs[k].first, tb, pairs[k].second);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t tb = 0; tb < T; ++tb)
      for (int64_t ha = 0; ha < a.heads; ++ha)
        for (int64_t hb = 0; hb < b.heads; ++hb) {
          Matrix64 m(dha, dhb);  // Σ_{u ≤ t, u' ≤ t'} c · ⟨v_u | v'_u'⟩ over the two heads
          for (int64_t u = 0; u <= t; ++u)
            for (int64_t ub = 0; ub <= tb; ++ub) {
              const auto& q = grams[size_t(t)][size_t(tb)];  // query legs at t, t'
              const auto& k = grams[size_t(u)][size_t(ub)];  // key and value legs at u, u'
              const int64_t r0 = ha * dha, c0 = hb * dhb;
              auto dot = [&](size_t qi, size_t ki) {
                // Σ_{i,ı} ⟨q_i|q'_ı⟩⟨k_i|k'_ı⟩ over the heads' blocks (q and k share the index i).
                double s = 0;
                for (int64_t i = 0; i < dha; ++i)
                  for (int64_t j = 0; j < dhb; ++j) s += q[qi](r0 + i, c0 + j) * k[ki](r0 + i, c0 + j);
                return s;
              };
              const double direct = dot(0, 1) * dot(2, 3), swapped = dot(4, 5) * dot(6, 7);
              const double c = 0.5 * (direct + swapped) * a.coef * b.coef;
              if (c == 0) continue;
              for (int64_t i = 0; i < dha; ++i)
                for (int64_t j = 0; j < dhb; ++j) m(i, j) += c * k[8](r0 + i, c0 + j);
            }
          add_projected(out, coordinate(a.dim, t, 0), coordinate(b.dim, tb, 0), a.proj, ha * dha, m, b.proj, hb * dhb);
        }
  return out;
}

void check_pair(const PolynomialView& a, const PolynomialView& b) {
  check(a.positions == b.positions && a.input_dim == b.input_dim && a.output_dim() == b.output_dim(),
        "network tensor: ", a.arch, " and ", b.arch, " differ in their positions, input or output sizes");
  check(a.steps.size() == b.steps.size(), "network tensor: ", a.arch, " has ", a.steps.size(), " steps and ", b.arch, " ",
        b.steps.size(), "; the layers must be of the same kinds in the same order");
  for (size_t i = 0; i < a.steps.size(); ++i)
    check(a.steps[i].kind == b.steps[i].kind && a.steps[i].residual == b.steps[i].residual, "network tensor: layer '",
          a.steps[i].name, "' and layer '", b.steps[i].name, "' are of different kinds");
}

// How many copies of the state a step's units multiply: the power of G in the next Gram matrix.
int step_degree(const PolynomialStep& s) {
  switch (s.kind) {
    case PolynomialStep::Kind::Linear: return 1;
    case PolynomialStep::Kind::Bilinear: return 2;
    case PolynomialStep::Kind::Attention: return 5;
  }
  return 1;
}

// The Gram matrix after step i, from the one before it.
Matrix64 next_gram(const PolynomialView& a, const PolynomialView& b, size_t i, const Matrix64& g) {
  const PolynomialStep &sa = a.steps[i], &sb = b.steps[i];
  const int64_t T = a.positions;
  const int64_t in_a = i ? a.width_after(i - 1) : a.input_dim, in_b = i ? b.width_after(i - 1) : b.input_dim;
  switch (sa.kind) {
    case PolynomialStep::Kind::Linear:
      return matmul(matmul(linear_map(sa, T, in_a), g), linear_map(sb, T, in_b), false, true);
    case PolynomialStep::Kind::Bilinear:
      return bilinear_gram(bilinear_units(sa, T, in_a), bilinear_units(sb, T, in_b), g);
    case PolynomialStep::Kind::Attention:
      return attention_gram(attention_legs(sa, T, in_a), attention_legs(sb, T, in_b), g);
  }
  return g;
}

}  // namespace

std::vector<Matrix64> network_tensor_grams(const PolynomialView& a, const PolynomialView& b) {
  check_pair(a, b);
  std::vector<Matrix64> out = {Matrix64::identity(state_size(a.positions, a.input_dim))};
  for (size_t i = 0; i < a.steps.size(); ++i) out.push_back(next_gram(a, b, i, out.back()));
  return out;
}

NetworkTensorInner network_tensor_inner(const PolynomialView& a, const PolynomialView& b) {
  check_pair(a, b);
  Matrix64 g = Matrix64::identity(state_size(a.positions, a.input_dim));
  NetworkTensorInner r;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    g = next_gram(a, b, i, g);
    // The step is homogeneous in G of its degree: a scale c before it is c^degree after.
    r.log_scale *= double(step_degree(a.steps[i]));
    double largest = 0;
    for (double v : g.data) largest = std::max(largest, std::abs(v));
    check(std::isfinite(largest), "network tensor: the inner products after layer '", a.steps[i].name, "' are not finite");
    if (largest > 0) {
      for (double& v : g.data) v /= largest;
      r.log_scale += std::log(largest);
    }
  }
  const int64_t width = a.output_dim();
  for (int64_t t = 0; t < a.positions; ++t)
    for (int64_t o = 0; o < width; ++o) r.value.push_back(g(coordinate(width, t, o), coordinate(width, t, o)));
  return r;
}

}  // namespace adjoint
