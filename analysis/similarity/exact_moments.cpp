#include "analysis/similarity/exact_moments.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include "engine/error.h"
#include "engine/matrix64.h"

namespace adjoint {

int64_t IndexedTensor::size() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int IndexedTensor::axis(int id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return int(i);
  return -1;
}

int64_t telephone_number(int64_t legs) {
  int64_t before = 1, now = 1;  // tel(0), tel(1)
  if (legs <= 1) return 1;
  for (int64_t n = 2; n <= legs; ++n) {
    const int64_t next = now + (n - 1) * before;
    before = now, now = next;
  }
  return now;
}

namespace {

// Index 0 is the padded input x̃ = (1, x); every other index is numbered once, program-wide,
// so that pieces built apart never share an index by accident.
constexpr int kInput = 0;
std::atomic<int> next_index{1};
int fresh_index() { return next_index++; }

// ---- Dense tensors over numbered indices ------------------------------------------------

// t's values with its axes in the order `order` (a permutation of t.ids).
std::vector<double> permuted(const IndexedTensor& t, const std::vector<int>& order) {
  const size_t rank = t.ids.size();
  std::vector<int64_t> stride(rank, 1);
  for (size_t i = rank; i-- > 1;) stride[i - 1] = stride[i] * t.dims[i];
  std::vector<int64_t> dims(rank), from(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int a = t.axis(order[k]);
    dims[k] = t.dims[size_t(a)], from[k] = stride[size_t(a)];
  }
  std::vector<double> out(size_t(t.size()));
  std::vector<int64_t> at(rank, 0);
  int64_t offset = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.data[size_t(offset)];
    for (size_t k = rank; k-- > 0;) {  // odometer over the new order
      offset += from[k];
      if (++at[k] < dims[k]) break;
      offset -= from[k] * dims[k], at[k] = 0;
    }
  }
  return out;
}

int64_t product_of(const IndexedTensor& a, const IndexedTensor& b, const std::vector<int>& ids) {
  int64_t n = 1;
  for (int id : ids) n *= a.axis(id) >= 0 ? a.dims[size_t(a.axis(id))] : b.dims[size_t(b.axis(id))];
  return n;
}

// Σ over the indices a and b share that `needed` rejects; shared indices it keeps stay once
// (a hidden unit's index, read by both legs of its product), the others stay as they are.
// Result axes: the kept shared ones, a's own, b's own. One dgemm per kept shared value.
IndexedTensor contract_pair(const IndexedTensor& a, const IndexedTensor& b, const std::function<bool(int)>& needed) {
  std::vector<int> batch, summed, a_own, b_own;
  for (int id : a.ids) (b.axis(id) < 0 ? a_own : needed(id) ? batch : summed).push_back(id);
  for (int id : b.ids)
    if (a.axis(id) < 0) b_own.push_back(id);
  const int64_t nb = product_of(a, b, batch), m = product_of(a, b, a_own), k = product_of(a, b, summed),
                n = product_of(a, b, b_own);
  std::vector<int> a_order = batch, b_order = batch;
  a_order.insert(a_order.end(), a_own.begin(), a_own.end());
  a_order.insert(a_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), b_own.begin(), b_own.end());
  const std::vector<double> pa = permuted(a, a_order), pb = permuted(b, b_order);
  IndexedTensor c;
  c.ids = batch;
  c.ids.insert(c.ids.end(), a_own.begin(), a_own.end());
  c.ids.insert(c.ids.end(), b_own.begin(), b_own.end());
  for (int id : c.ids) c.dims.push_back(product_of(a, b, {id}));
  c.data.assign(size_t(nb * m * n), 0.0);
  if (m * n * k == 0) return c;
  for (int64_t i = 0; i < nb; ++i)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0, pa.data() + i * m * k, int(k),
                pb.data() + i * k * n, int(n), 0.0, c.data.data() + i * m * n, int(n));
  return c;
}

// Σ over every index of t but `keep`, then t's axes in the order of `keep`.
IndexedTensor reduce_to(const IndexedTensor& t, const std::vector<int>& keep) {
  IndexedTensor ones;  // a tensor of ones over the indices to sum: one contraction sums them
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (std::find(keep.begin(), keep.end(), t.ids[i]) == keep.end()) ones.ids.push_back(t.ids[i]), ones.dims.push_back(t.dims[i]);
  IndexedTensor r = t;
  if (!ones.ids.empty()) {
    ones.data.assign(size_t(ones.size()), 1.0);
    r = contract_pair(t, ones, [](int) { return false; });
  }
  check(r.ids.size() == keep.size(), "exact moments: a kept index is missing from the network");
  IndexedTensor out{keep, {}, permuted(r, keep)};
  for (int id : keep) out.dims.push_back(r.dims[size_t(r.axis(id))]);
  return out;
}

// The whole network contracted to the indices `keep`, a pair at a time: each time the pair
// whose result is smallest (then cheapest), among pairs that share an index.
IndexedTensor contract_network(std::vector<IndexedTensor> ts, const std::vector<int>& keep) {
  check(!ts.empty(), "exact moments: an empty network");
  while (ts.size() > 1) {
    size_t bi = 0, bj = 1;
    int64_t best_size = std::numeric_limits<int64_t>::max(), best_flops = best_size;
    bool best_shares = false;
    for (size_t i = 0; i < ts.size(); ++i)
      for (size_t j = i + 1; j < ts.size(); ++j) {
        int64_t size = 1, flops = 1;
        bool shares = false;
        auto elsewhere = [&](int id) {
          if (std::find(keep.begin(), keep.end(), id) != keep.end()) return true;
          for (size_t o = 0; o < ts.size(); ++o)
            if (o != i && o != j && ts[o].axis(id) >= 0) return true;
          return false;
        };
        for (size_t x = 0; x < ts[i].ids.size(); ++x) {
          const int id = ts[i].ids[x];
          const bool in_j = ts[j].axis(id) >= 0;
          shares |= in_j;
          flops *= ts[i].dims[x];
          if (!in_j || elsewhere(id)) size *= ts[i].dims[x];
        }
        for (size_t y = 0; y < ts[j].ids.size(); ++y)
          if (ts[i].axis(ts[j].ids[y]) < 0) size *= ts[j].dims[y], flops *= ts[j].dims[y];
        if (std::make_tuple(!shares, size, flops) < std::make_tuple(!best_shares, best_size, best_flops))
          bi = i, bj = j, best_size = size, best_flops = flops, best_shares = shares;
      }
    auto needed = [&](int id) {
      if (std::find(keep.begin(), keep.end(), id) != keep.end()) return true;
      for (size_t o = 0; o < ts.size(); ++o)
        if (o != bi && o != bj && ts[o].axis(id) >= 0) return true;
      return false;
    };
    IndexedTensor c = contract_pair(ts[bi], ts[bj], needed);
    ts.erase(ts.begin() + long(bj));
    ts[bi] = std::move(c);
  }
  return reduce_to(ts.front(), keep);
}

IndexedTensor matrix_tensor(const Matrix64& m, int row_id, int col_id) { return {{row_id, col_id}, {m.rows, m.cols}, m.data}; }
IndexedTensor vector_tensor(std::vector<double> v, int id) { return {{id}, {int64_t(v.size())}, std::move(v)}; }

// ---- The expansion, layer by layer --------------------------------------------------------

// A piece with every index renumbered afresh (the input's excepted), its open index `open`.
PolynomialPiece renumbered(const PolynomialPiece& p, int open) {
  std::vector<std::pair<int, int>> map{{kInput, kInput}, {p.open, open}};
  auto renumber = [&](IndexedTensor t) {
    for (int& id : t.ids) {
      auto it = std::find_if(map.begin(), map.end(), [&](const auto& m) { return m.first == id; });
      if (it == map.end()) it = map.insert(map.end(), {id, fresh_index()});
      id = it->second;
    }
    return t;
  };
  PolynomialPiece out{open, {}, {}};
  for (const IndexedTensor& t : p.factors) out.factors.push_back(renumber(t));
  for (const IndexedTensor& t : p.legs) out.legs.push_back(renumber(t));
  return out;
}

// The network's state: a sum of pieces over one open index of `positions · width` values.
struct State {
  std::vector<PolynomialPiece> pieces;
  int open = 0;
  int64_t width = 0;
};

// Pieces of at most one leg, and constants, folded into one affine leg over (open, input):
// what keeps a residual MLP at one piece per product of legs.
void fold_affine(State& s, int64_t positions, int64_t input_size) {
  const int64_t rows = positions * s.width;
  Matrix64 affine(rows, 1 + input_size);
  bool any = false;
  std::vector<PolynomialPiece> kept;
  for (PolynomialPiece& p : s.pieces) {
    if (p.legs.size() > 1) {
      kept.push_back(std::move(p));
      continue;
    }
    std::vector<IndexedTensor> all = p.factors;
    all.insert(all.end(), p.legs.begin(), p.legs.end());
    const IndexedTensor v = p.legs.empty() ? contract_network(all, {p.open}) : contract_network(all, {p.open, kInput});
    for (int64_t r = 0; r < rows; ++r)
      if (p.legs.empty()) affine(r, 0) += v.data[size_t(r)];
      else
        for (int64_t c = 0; c <= input_size; ++c) affine(r, c) += v.data[size_t(r * (1 + input_size) + c)];
    any = true;
  }
  if (any) kept.insert(kept.begin(), PolynomialPiece{s.open, {}, {matrix_tensor(affine, s.open, kInput)}});
  s.pieces = std::move(kept);
}

// The same matrix at every position: (T·rows) × (T·cols), block-diagonal.
Matrix64 at_every_position(const Matrix64& m, int64_t positions) {
  Matrix64 out(positions * m.rows, positions * m.cols);
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) out(t * m.rows + r, t * m.cols + c) = m(r, c);
  return out;
}

// h ← M h + bias, M acting on every piece; `bias` (positions·rows values) may be empty.
State mapped(const State& s, const Matrix64& m, const std::vector<double>& bias, int64_t width, int64_t positions,
             int64_t input_size) {
  State out{{}, fresh_index(), width};
  for (const PolynomialPiece& p : s.pieces) {
    PolynomialPiece q = renumbered(p, fresh_index());
    q.factors.push_back(matrix_tensor(m, out.open, q.open));
    q.open = out.open;
    out.pieces.push_back(std::move(q));
  }
  if (!bias.empty()) out.pieces.push_back({out.open, {vector_tensor(bias, out.open)}, {}});
  fold_affine(out, positions, input_size);
  return out;
}

State linear_step(const State& s, const PolynomialStep& step, int64_t positions, int64_t input_size) {
  const Matrix64 w = to_matrix64(step.weight);
  std::vector<double> bias;
  if (step.bias.defined()) {
    const Matrix64 b = to_matrix64(step.bias);  // (1, out) or (positions, out)
    for (int64_t t = 0; t < positions; ++t)
      for (int64_t o = 0; o < w.rows; ++o) bias.push_back(b(b.rows == 1 ? 0 : t, o));
  }
  return mapped(s, at_every_position(w, positions), bias, w.rows, positions, input_size);
}

// Columns 1.. of a (hidden, 1 + width) form at every position, and its column 0 (the bias).
std::pair<Matrix64, std::vector<double>> split_form(const Matrix64& form, int64_t positions) {
  const Matrix64 on_h = at_every_position(columns(form, 1, form.cols), positions);
  std::vector<double> bias;
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t h = 0; h < form.rows; ++h) bias.push_back(form(h, 0));
  return {on_h, bias};
}

State bilinear_step(const State& s, const PolynomialStep& step, int64_t positions, int64_t input_size) {
  const Matrix64 l = to_matrix64(step.left), r = to_matrix64(step.right);
  Matrix64 d = step.down.defined() ? to_matrix64(step.down) : Matrix64::identity(l.rows);
  if (step.residual)
    for (double& v : d.data) v *= step.scale;
  const auto [l_on_h, l_bias] = split_form(l, positions);
  const auto [r_on_h, r_bias] = split_form(r, positions);
  const State left = mapped(s, l_on_h, l_bias, l.rows, positions, input_size);
  const State right = mapped(s, r_on_h, r_bias, r.rows, positions, input_size);
  State out{{}, fresh_index(), d.rows};
  const Matrix64 down = at_every_position(d, positions);
  for (const PolynomialPiece& p : left.pieces)
    for (const PolynomialPiece& q : right.pieces) {
      // (L h̃) ⊙ (R h̃): both pieces read the same hidden unit, one index shared by their ends.
      const int unit = fresh_index();
      PolynomialPiece product = renumbered(p, unit);
      const PolynomialPiece other = renumbered(q, unit);
      product.factors.insert(product.factors.end(), other.factors.begin(), other.factors.end());
      product.legs.insert(product.legs.end(), other.legs.begin(), other.legs.end());
      product.factors.push_back(matrix_tensor(down, out.open, unit));
      product.open = out.open;
      out.pieces.push_back(std::move(product));
    }
  if (step.residual) {
    check(d.rows == s.width, "exact moments: residual layer '", step.name, "' changes the width from ", s.width, " to ",
          d.rows);
    for (const PolynomialPiece& p : s.pieces) out.pieces.push_back(renumbered(p, out.open));
  }
  fold_affine(out, positions, input_size);
  return out;
}

// Chains of weights contracted ahead of the matchings: two factors joined by an index no
// other tensor reads become one when that is no larger, so each matching contracts fewer.
void contract_chains(PolynomialPiece& p) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < p.factors.size() && !changed; ++i)
      for (size_t j = i + 1; j < p.factors.size() && !changed; ++j) {
        auto readers = [&](int id) {
          int n = 0;
          for (const IndexedTensor& t : p.factors) n += t.axis(id) >= 0;
          for (const IndexedTensor& t : p.legs) n += t.axis(id) >= 0;
          return n + (id == p.open);
        };
        bool joined = false;
        for (int id : p.factors[i].ids) joined |= p.factors[j].axis(id) >= 0;
        if (!joined) continue;
        IndexedTensor c = contract_pair(p.factors[i], p.factors[j], [&](int id) { return readers(id) > 2; });
        if (c.size() > std::max(p.factors[i].size(), p.factors[j].size())) continue;
        p.factors.erase(p.factors.begin() + long(j));
        p.factors[i] = std::move(c);
        changed = true;
      }
  }
}

}  // namespace

bool expandable(const PolynomialView& view, std::string* why) {
  for (const PolynomialStep& s : view.steps)
    if (s.kind == PolynomialStep::Kind::Attention) {
      if (why) *why = cat("layer '", s.name, "' is a bilinear attention (five legs; after it the Isserlis sum has too many matchings)");
      return false;
    }
  return true;
}

OutputExpansion expand_output(const PolynomialView& view) {
  std::string why;
  if (!expandable(view, &why)) throw Error(cat("exact moments: ", view.arch, ": ", why));
  const int64_t T = view.positions, n = T * view.input_dim;
  // The input itself: one leg, the identity on x (column 0, the constant, is zero).
  State s{{}, fresh_index(), view.input_dim};
  Matrix64 identity(n, 1 + n);
  for (int64_t i = 0; i < n; ++i) identity(i, 1 + i) = 1.0;
  s.pieces.push_back({s.open, {}, {matrix_tensor(identity, s.open, kInput)}});
  for (const PolynomialStep& step : view.steps)
    s = step.kind == PolynomialStep::Kind::Linear ? linear_step(s, step, T, n) : bilinear_step(s, step, T, n);
  OutputExpansion out{view.arch, n, T, s.width, std::move(s.pieces)};
  for (PolynomialPiece& p : out.pieces) contract_chains(p);
  return out;
}

OutputExpansion expansion_difference(OutputExpansion a, const OutputExpansion& b) {
  check(a.input_size == b.input_size && a.positions == b.positions && a.classes == b.classes, "exact moments: ", a.arch,
        " and ", b.arch, " have different inputs or outputs; their difference is undefined");
  for (const PolynomialPiece& p : b.pieces) {
    PolynomialPiece negative = p;
    check(!negative.factors.empty() || !negative.legs.empty(), "exact moments: an empty piece");
    IndexedTensor& t = negative.factors.empty() ? negative.legs.front() : negative.factors.front();
    for (double& v : t.data) v = -v;
    a.pieces.push_back(std::move(negative));
  }
  return a;
}

std::vector<double> evaluate_expansion(const OutputExpansion& e, const std::vector<double>& x) {
  check(int64_t(x.size()) == e.input_size, "evaluate_expansion: ", e.arch, " reads ", e.input_size, " values, got ", x.size());
  std::vector<double> padded{1.0};
  padded.insert(padded.end(), x.begin(), x.end());
  std::vector<double> out(size_t(e.positions * e.classes), 0.0);
  for (const PolynomialPiece& p : e.pieces) {
    std::vector<IndexedTensor> network = p.factors;
    for (const IndexedTensor& leg : p.legs) {
      network.push_back(leg);
      network.push_back(vector_tensor(padded, kInput));
    }
    // Each leg reads its own copy of x̃: contract it before the next leg adds another.
    std::vector<IndexedTensor> applied(network.begin(), network.begin() + long(p.factors.size()));
    for (size_t i = p.factors.size(); i < network.size(); i += 2)
      applied.push_back(contract_pair(network[i], network[i + 1], [](int id) { return id != kInput; }));
    const IndexedTensor v = contract_network(applied, {p.open});
    for (size_t k = 0; k < out.size(); ++k) out[k] += v.data[k];
  }
  return out;
}

int64_t exact_contractions(const OutputExpansion& a, const OutputExpansion& b) {
  int64_t n = 0;
  for (const PolynomialPiece& p : a.pieces)
    for (const PolynomialPiece& q : b.pieces) n += telephone_number(int64_t(p.legs.size() + q.legs.size()));
  return n;
}

namespace {

// A leg x̃ ↦ X x̃ split into its mean X[:, 0] (x is centred) and its random part σ·X[:, 1:].
struct SplitLeg {
  IndexedTensor mean, centred;
};

SplitLeg split_leg(const IndexedTensor& leg, double input_std) {
  std::vector<int> order;
  for (int id : leg.ids)
    if (id != kInput) order.push_back(id);
  const int64_t rows = leg.size() / leg.dims[size_t(leg.axis(kInput))], cols = leg.dims[size_t(leg.axis(kInput))];
  std::vector<int> with_input = order;
  with_input.push_back(kInput);
  const std::vector<double> v = permuted(leg, with_input);
  SplitLeg s{{order, {}, {}}, {with_input, {}, {}}};
  for (int id : order) s.mean.dims.push_back(leg.dims[size_t(leg.axis(id))]);
  s.centred.dims = s.mean.dims;
  s.centred.dims.push_back(cols - 1);
  for (int64_t r = 0; r < rows; ++r) {
    s.mean.data.push_back(v[size_t(r * cols)]);
    for (int64_t c = 1; c < cols; ++c) s.centred.data.push_back(input_std * v[size_t(r * cols + c)]);
  }
  return s;
}

// E[p·q] over the open index: the Isserlis sum over every partial matching of their legs.
std::vector<double> piece_inner(const PolynomialPiece& p, const PolynomialPiece& q, double input_std) {
  std::vector<SplitLeg> legs;
  for (const IndexedTensor& l : p.legs) legs.push_back(split_leg(l, input_std));
  for (const IndexedTensor& l : q.legs) legs.push_back(split_leg(l, input_std));
  const size_t m = legs.size();
  std::vector<std::vector<IndexedTensor>> bridge(m, std::vector<IndexedTensor>(m));
  for (size_t i = 0; i < m; ++i)
    for (size_t j = i + 1; j < m; ++j)
      bridge[i][j] = contract_pair(legs[i].centred, legs[j].centred, [](int id) { return id != kInput; });
  std::vector<IndexedTensor> network = p.factors;
  network.insert(network.end(), q.factors.begin(), q.factors.end());
  const size_t weights = network.size();
  std::vector<bool> used(m, false);
  std::vector<double> sum;
  std::function<void()> match = [&] {
    size_t i = 0;
    while (i < m && used[i]) ++i;
    if (i == m) {
      const IndexedTensor v = contract_network(network, {p.open});
      if (sum.empty()) sum.assign(v.data.size(), 0.0);
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += v.data[k];
      return;
    }
    used[i] = true;
    network.push_back(legs[i].mean);  // i unmatched: its mean
    match();
    network.pop_back();
    for (size_t j = i + 1; j < m; ++j) {
      if (used[j]) continue;
      used[j] = true;
      network.push_back(bridge[i][j]);  // i and j matched: their covariance
      match();
      network.pop_back();
      used[j] = false;
    }
    used[i] = false;
  };
  match();
  check(network.size() == weights, "exact moments: the matching left tensors behind");
  return sum;
}

}  // namespace

std::vector<double> exact_output_inner(const OutputExpansion& a, const OutputExpansion& b, double input_std) {
  check(a.input_size == b.input_size && a.positions == b.positions && a.classes == b.classes, "exact moments: ", a.arch,
        " reads ", a.input_size, " inputs into ", a.positions * a.classes, " outputs, ", b.arch, " ", b.input_size,
        " into ", b.positions * b.classes);
  std::vector<double> total(size_t(a.positions * a.classes), 0.0);
  for (const PolynomialPiece& p : a.pieces)
    for (const PolynomialPiece& q : b.pieces) {
      const std::vector<double> v = piece_inner(p, renumbered(q, p.open), input_std);
      for (size_t k = 0; k < total.size(); ++k) total[k] += v[k];
    }
  return total;
}

DeepSimilarity similarity_from_inner(const std::vector<double>& ab, const std::vector<double>& aa,
                                     const std::vector<double>& bb, int64_t classes) {
  check(ab.size() == aa.size() && ab.size() == bb.size() && classes > 0 && ab.size() % size_t(classes) == 0,
        "similarity_from_inner: ", ab.size(), ", ", aa.size(), " and ", bb.size(), " values for ", classes, " classes");
  DeepSimilarity r;
  const size_t C = static_cast<size_t>(classes);
  std::vector<double> xy(C), xx(C), yy(C);
  for (size_t k = 0; k < ab.size(); ++k) {
    r.inner_ab += ab[k], r.inner_aa += aa[k], r.inner_bb += bb[k];
    xy[k % C] += ab[k], xx[k % C] += aa[k], yy[k % C] += bb[k];
  }
  r.similarity = r.inner_ab / std::sqrt(r.inner_aa * r.inner_bb);
  for (int64_t o = 0; o < classes; ++o) r.slices.push_back(xy[size_t(o)] / std::sqrt(xx[size_t(o)] * yy[size_t(o)]));
  return r;
}

DeepSimilarity exact_similarity(const OutputExpansion& a, const OutputExpansion& b, double input_std) {
  return similarity_from_inner(exact_output_inner(a, b, input_std), exact_output_inner(a, a, input_std),
                               exact_output_inner(b, b, input_std), a.classes);
}

}  // namespace adjoint
