#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/fast_exp.h"
#include "engine/flops.h"
#include "engine/gemm.h"
#include "engine/lane_sum.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

namespace adjoint {

namespace {

// Extents of one call: `batch` independent heads, T queries, S keys, head sizes d and dv.
struct AttentionShape {
  int64_t batch, T, S, d, dv;
};

// Where one operand's per-head matrices lie: rows `ld` floats apart, head i's matrix at
// heads.at(i) from the operand's first element. Separate q, k, v tensors are contiguous
// (batch, rows, cols); a packed qkv tensor interleaves the heads within each token's row.
struct HeadLayout {
  int64_t ld;
  BatchStrides heads;
};

// Where q, k or v is read from: input `input` of the op, `offset` elements in, in `layout`.
struct Operand {
  size_t input;
  int64_t offset;
  HeadLayout layout;
};

// The kernels of the per-head products. A head's products are small (a ViT-B/16 head is
// 197 × 197 × 64), and on them the engine's AVX-512 kernel outran OpenBLAS's, which packs
// both operands for each (docs/benchmarks.md); it sums every element in one fixed order, so
// the bits do not depend on the thread count either.
constexpr GemmKernel kHeadKernel = GemmKernel::widest;

// softmax of one row of n scores, in place. Sixteen independent lanes carry the running
// maximum and the sum of the exponentials, so that each loop is a vector of the widest
// kind (AVX-512 holds sixteen floats), the exponentials are summed in the loop that makes
// them, and the order of operations, hence the bits, is the same at every vector width.
// The last partial vector is padded to a whole one, so it runs in the vector loop too
// rather than through a scalar exp per score (a ViT-B/16 row of 197 ends in five).
[[gnu::always_inline]] inline void softmax_row(float* row, int64_t n) {
  constexpr int64_t kLanes = 16;
  const int64_t whole = n - n % kLanes, rest = n - whole;
  float top[kLanes];
  std::fill(top, top + kLanes, -INFINITY);
  // std::max's test, written out, and the lanes' loop kept whole: the compiler makes the
  // loop one vector maximum then, where std::max (it returns a reference) or a loop
  // unrolled into sixteen scalars stayed scalar.
  const auto larger = [](float a, float b) { return b > a ? b : a; };
  for (int64_t l = 0; l < whole; l += kLanes)
#pragma GCC unroll 1
    for (int64_t k = 0; k < kLanes; ++k) top[k] = larger(top[k], row[l + k]);
  for (int64_t k = 0; k < rest; ++k) top[k] = larger(top[k], row[whole + k]);
  float peak = -INFINITY;
  for (int64_t k = 0; k < kLanes; ++k) peak = std::max(peak, top[k]);
  float sum[kLanes] = {};
  for (int64_t l = 0; l < whole; l += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) {
      const float e = fast_exp_fused(row[l + k] - peak);
      row[l + k] = e;
      sum[k] += e;
    }
  if (rest > 0) {
    float tail[kLanes];
    for (int64_t k = 0; k < kLanes; ++k) tail[k] = fast_exp_fused((k < rest ? row[whole + k] : peak) - peak);
    for (int64_t k = 0; k < kLanes; ++k) sum[k] += k < rest ? tail[k] : 0.0f;
    std::copy(tail, tail + rest, row + whole);
  }
  double total = 0;
  for (int64_t k = 0; k < kLanes; ++k) total += sum[k];
  const float inv = float(1.0 / total);
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

// softmax over each of a head's T rows of S scores, in place (query i sees keys 0..i under
// the causal mask; at least key 0 always, so no row is empty).
void softmax_rows(float* scores, int64_t T, int64_t S, bool causal) {
  run_widest([&] {  // the exp's fused multiply-adds are instructions there (engine/fast_exp.h)
    for (int64_t i = 0; i < T; ++i) {
      float* row = scores + i * S;
      const int64_t visible = causal ? std::min<int64_t>(S, i + 1) : S;
      softmax_row(row, visible);
      std::fill(row + visible, row + S, 0.0f);
    }
  });
}

// Head b's pattern softmax(Q Kᵀ·alpha [+ mask]) into `a` (T × S, rows S apart). The forward
// pass uses alpha = s; the soft pullback alpha = s/τ.
void head_pattern(int64_t b, const float* q, const HeadLayout& lq, const float* k, const HeadLayout& lk,
                  const AttentionShape& sh, float alpha, bool causal, float* a) {
  gemm(false, true, sh.T, sh.S, sh.d, alpha, q + lq.heads.at(b), lq.ld, k + lk.heads.at(b), lk.ld, 0.0f, a, sh.S,
       kHeadKernel);
  softmax_rows(a, sh.T, sh.S, causal);
}

// Runs body(b, block) for every head b in parallel, a head at a time, so that a head's T × S
// block (its pattern, or its pattern's cotangent) stays in cache from the product that
// writes it through the softmax to the products that read it, rather than every head's
// blocks passing through memory between batched products. `kept` (batch × T × S floats, or
// null) holds the blocks for later (the forward pattern of a recorded op); without it each
// task works in a scratch block of its own. Each head's products and softmax are the same
// operations whatever the thread count, and a large product still splits inside gemm.
void for_each_head(const AttentionShape& sh, float* kept, const std::function<void(int64_t, float*)>& body) {
  const int64_t block = sh.T * sh.S;
  parallel_for(sh.batch, 1, [&](int64_t b0, int64_t b1) {
    Tensor scratch = kept ? Tensor() : Tensor::empty({block});
    for (int64_t b = b0; b < b1; ++b) body(b, kept ? kept + b * block : scratch.data());
  });
}

// One call's operands: q, k and v (from one packed input or from three), the output's
// layout (the cotangent's too), and the shape.
struct AttentionCall {
  Operand q, k, v;
  HeadLayout out;
  AttentionShape shape;
  bool causal;
  float scale;
};

class AttentionNode : public Node {
public:
  // `inputs` are the op's inputs, detached and contiguous; `a` the forward pattern.
  AttentionNode(std::vector<Tensor> inputs, Tensor a, AttentionCall call)
      : inputs_(std::move(inputs)), a_(std::move(a)), c_(call) {}
  std::string name() const override { return "scaled_dot_product_attention"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    const auto [batch, T, S, d, dv] = c_.shape;
    const Operand* operands[3] = {&c_.q, &c_.k, &c_.v};
    // v is always transported; only the gradient differentiates the pattern, so only it
    // reaches q and k (the pullbacks hold the pattern fixed).
    bool written[3];
    for (int j = 0; j < 3; ++j) written[j] = needs[operands[j]->input] && (j == 2 || t.is_gradient());
    // An input's cotangent: uninitialised when the products below write all of it, zeros
    // when part of it (q and k of a packed input under a pullback) receives nothing.
    std::vector<Tensor> out(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      bool any = false, all = true;
      for (int j = 0; j < 3; ++j)
        if (operands[j]->input == i) any |= written[j], all &= written[j];
      if (any) out[i] = all ? Tensor::empty(inputs_[i].shape()) : Tensor::zeros(inputs_[i].shape());
    }
    auto value = [&](const Operand& o) { return inputs_[o.input].data() + o.offset; };
    auto cotangent = [&](const Operand& o) { return out[o.input].data() + o.offset; };
    const HeadLayout &lq = c_.q.layout, &lk = c_.k.layout, &lv = c_.v.layout, &lu = c_.out;
    const float* pu = u.data();
    const float *q = value(c_.q), *k = value(c_.k), *v = value(c_.v);
    // dV = Aᵀ u for head b, A its forward pattern or, for the soft pullback, the re-tempered
    // one. gemm writes every element, zeros when there are no queries (T = 0, an empty sum).
    auto value_cotangent = [&](int64_t b, const float* a) {
      gemm(true, false, S, dv, T, 1.0f, a, S, pu + lu.heads.at(b), lu.ld, 0.0f, cotangent(c_.v) + lv.heads.at(b), lv.ld,
           kHeadKernel);
    };
    if (!written[0] && !written[1]) {  // the pullbacks, or a gradient that reaches v alone
      if (!written[2]) return out;
      if (!t.is_soft()) {
        for_each_head(c_.shape, a_.data(), [&](int64_t b, float* a) { value_cotangent(b, a); });
        return out;
      }
      const float alpha = c_.scale / t.tau.attention;
      for_each_head(c_.shape, nullptr, [&](int64_t b, float* a) {
        head_pattern(b, q, lq, k, lk, c_.shape, alpha, c_.causal, a);
        value_cotangent(b, a);
      });
      return out;
    }

    // The gradient, head by head: dV = Aᵀ u; dA = u Vᵀ, then through the softmax
    // dZ = A ⊙ (dA − rowsum(dA ⊙ A)); dQ = s·dZ K and dK = s·dZᵀ Q (each written in full).
    const float* pa = a_.data();
    for_each_head(c_.shape, nullptr, [&](int64_t b, float* dz) {
      const float* ab = pa + b * T * S;
      if (written[2]) value_cotangent(b, ab);
      gemm(false, true, T, S, dv, 1.0f, pu + lu.heads.at(b), lu.ld, v + lv.heads.at(b), lv.ld, 0.0f, dz, S,
           kHeadKernel);
      run_widest([&] {
        for (int64_t i = 0; i < T; ++i) {
          const float* ar = ab + i * S;
          float* zr = dz + i * S;
          const float dot = float(lane_sum(S, [ar, zr](int64_t j) { return zr[j] * ar[j]; }));
          for (int64_t j = 0; j < S; ++j) zr[j] = ar[j] * (zr[j] - dot);  // masked: A = 0
        }
      });
      if (written[0])
        gemm(false, false, T, d, S, c_.scale, dz, S, k + lk.heads.at(b), lk.ld, 0.0f, cotangent(c_.q) + lq.heads.at(b),
             lq.ld, kHeadKernel);
      if (written[1])
        gemm(true, false, S, d, T, c_.scale, dz, S, q + lq.heads.at(b), lq.ld, 0.0f, cotangent(c_.k) + lk.heads.at(b),
             lk.ld, kHeadKernel);
    });
    return out;
  }

public:
  void release() override {
    inputs_.clear();
    a_ = Tensor();
  }

private:
  std::vector<Tensor> inputs_;  // detached, contiguous: q, k, v or one packed qkv
  Tensor a_;                    // the forward pattern (batch, T, S)
  AttentionCall c_;
};

// The forward pass shared by both entry points: the pattern, then out = A V in the output's
// layout, and the node when an input needs a cotangent.
Tensor attend(std::vector<Tensor> inputs, const AttentionCall& c, const Shape& out_shape) {
  const auto& sh = c.shape;
  auto value = [&](const Operand& o) { return inputs[o.input].data() + o.offset; };
  const bool record = needs_grad(inputs);
  // A recorded op keeps every head's pattern for its backward pass; otherwise each head's
  // lives only in a task's scratch block.
  Tensor a = record ? Tensor::empty({sh.batch, sh.T, sh.S}) : Tensor();
  Tensor out = Tensor::empty(out_shape);
  count_multiply_adds(sh.batch * sh.T * sh.S * (sh.d + sh.dv));  // Q·Kᵀ and A·V
  const float *q = value(c.q), *k = value(c.k), *v = value(c.v);
  float* po = out.data();
  for_each_head(sh, record ? a.data() : nullptr, [&](int64_t b, float* pattern) {
    head_pattern(b, q, c.q.layout, k, c.k.layout, sh, c.scale, c.causal, pattern);
    gemm(false, false, sh.T, sh.dv, sh.S, 1.0f, pattern, sh.S, v + c.v.layout.heads.at(b), c.v.layout.ld, 0.0f,
         po + c.out.heads.at(b), c.out.ld, kHeadKernel);
  });
  if (record) {
    std::vector<Tensor> detached;
    for (const Tensor& x : inputs) detached.push_back(x.detach());
    attach(out, std::make_shared<AttentionNode>(std::move(detached), a, c), inputs);
  }
  return out;
}

float default_scale(float scale, int64_t d) { return scale < 0 ? float(1.0 / std::sqrt(double(d))) : scale; }

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  check(q.defined() && k.defined() && v.defined(), "scaled_dot_product_attention: undefined input");
  // Messages are built only on failure: this runs on every forward.
  auto require = [&](bool ok, const char* what) {
    if (!ok)
      throw Error(cat("scaled_dot_product_attention: ", what, ": q ", q.shape(), ", k ", k.shape(), ", v ",
                      v.shape()));
  };
  const int64_t rank = q.dim();
  require(rank >= 2 && k.dim() == rank && v.dim() == rank, "q, k, v need the same rank (at least 2)");
  require(std::equal(q.shape().begin(), q.shape().end() - 2, k.shape().begin()) &&
              std::equal(q.shape().begin(), q.shape().end() - 2, v.shape().begin()),
          "leading (batch, head) dims differ");
  require(q.size(-1) == k.size(-1), "q and k head sizes differ");
  require(k.size(-2) == v.size(-2), "k and v key counts differ");
  const AttentionShape sh{numel(Shape(q.shape().begin(), q.shape().end() - 2)), q.size(-2), k.size(-2), q.size(-1),
                          v.size(-1)};
  require(sh.d > 0 && sh.S > 0 && sh.dv > 0, "empty head or key set");
  scale = default_scale(scale, sh.d);
  const AttentionCall call{{0, 0, {sh.d, sh.T * sh.d}},
                           {1, 0, {sh.d, sh.S * sh.d}},
                           {2, 0, {sh.dv, sh.S * sh.dv}},
                           {sh.dv, sh.T * sh.dv},
                           sh,
                           causal,
                           scale};
  Shape out_shape = q.shape();
  out_shape.back() = sh.dv;
  return attend({q.contiguous(), k.contiguous(), v.contiguous()}, call, out_shape);
}

Tensor packed_qkv_attention(const Tensor& qkv, int64_t heads, bool causal, float scale) {
  check(qkv.defined(), "packed_qkv_attention: undefined input");
  check(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "packed_qkv_attention: expects qkv (batch, tokens, 3·dim), got ",
        qkv.shape());
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  check(heads > 0 && D % heads == 0, "packed_qkv_attention: dim ", D, " (qkv ", qkv.shape(),
        ") is not divisible by ", heads, " heads");
  check(T > 0 && D > 0, "packed_qkv_attention: empty token set or head: qkv ", qkv.shape());
  const int64_t dh = D / heads;
  const AttentionShape sh{B * heads, T, T, dh, dh};
  // Head h of example n: rows 3D apart, starting n·T·3D + h·dh in (q), then D and 2D further
  // (k, v). The output has the heads side by side in rows D apart.
  const HeadLayout in{3 * D, BatchStrides(T * 3 * D, heads, dh)};
  const AttentionCall call{{0, 0, in}, {0, D, in}, {0, 2 * D, in}, {D, BatchStrides(T * D, heads, dh)},
                           sh,         causal,     default_scale(scale, dh)};
  return attend({qkv.contiguous()}, call, {B, T, D});
}

Tensor packed_kv_attention(const Tensor& q, const Tensor& kv, int64_t heads, float scale) {
  check(q.defined() && kv.defined(), "packed_kv_attention: undefined input");
  check(q.dim() == 3 && kv.dim() == 3 && q.size(0) == kv.size(0) && kv.size(2) == 2 * q.size(2),
        "packed_kv_attention: expects q (batch, queries, dim) and kv (batch, tokens, 2·dim), got q ", q.shape(),
        " and kv ", kv.shape());
  const int64_t B = q.size(0), T = q.size(1), S = kv.size(1), D = q.size(2);
  check(heads > 0 && D % heads == 0, "packed_kv_attention: dim ", D, " (q ", q.shape(), ") is not divisible by ",
        heads, " heads");
  check(T > 0 && S > 0 && D > 0, "packed_kv_attention: no queries, keys or head: q ", q.shape(), ", kv ",
        kv.shape());
  const int64_t dh = D / heads;
  const AttentionShape sh{B * heads, T, S, dh, dh};
  // Head h of example n: q's rows D apart from n·T·D + h·dh (the output's likewise); k's
  // rows 2D apart from n·S·2D + h·dh, and v's D further.
  const HeadLayout queries{D, BatchStrides(T * D, heads, dh)}, keys{2 * D, BatchStrides(S * 2 * D, heads, dh)};
  const AttentionCall call{{0, 0, queries}, {1, 0, keys}, {1, D, keys}, queries, sh, false, default_scale(scale, dh)};
  return attend({q.contiguous(), kv.contiguous()}, call, {B, T, D});
}

}  // namespace adjoint
