// Scaled dot-product attention: exact gradient through Q, K, V; pullbacks through V only.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "ops/attention.h"
#include "ops/layout.h"
#include "ops/reference/reference.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

Tensor golden_t(const std::string& name) { return golden("transport", name); }

// Aᵀu for the pattern A = softmax(q kᵀ·scale/tau [+ causal mask]), computed in double from
// its definition by the reference attention (ops/reference/attention.cpp); shaped like v.
Tensor pattern_transposed_times(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& u, double scale,
                                bool causal, double tau = 1) {
  const int64_t T = q.size(-2), S = k.size(-2), d = q.size(-1), dv = v.size(-1);
  const reference::AttentionShape s{q.numel() / (T * d), T, S, d, dv, scale, causal};
  const reference::Values a = reference::attention_pattern(reference::values(q), reference::values(k), s, tau);
  return reference::to_tensor(v.shape(), reference::pattern_transposed_times(a, reference::values(u), s));
}

Tensor attend(const std::vector<Tensor>& in, bool causal, float scale = -1) {
  return scaled_dot_product_attention(in[0], in[1], in[2], causal, scale);
}

}  // namespace

TEST_CASE("attention: gradcheck through q, k, v with and without the causal mask") {
  const Tensor q = random_tensor({2, 2, 4, 3}, 1, -1.5, 1.5), k = random_tensor({2, 2, 5, 3}, 2, -1.5, 1.5),
               v = random_tensor({2, 2, 5, 2}, 3);
  check_gradients([](const std::vector<Tensor>& in) { return attend(in, false); }, {q, k, v});
  check_gradients([](const std::vector<Tensor>& in) { return attend(in, true); }, {q, k, v});
  // One batch dim only, and an explicit scale.
  check_gradients([](const std::vector<Tensor>& in) { return attend(in, true, 0.8f); },
                  {random_tensor({3, 4, 5}, 4, -1.5, 1.5), random_tensor({3, 4, 5}, 5, -1.5, 1.5),
                   random_tensor({3, 4, 2}, 6)});
}

TEST_CASE("attention: forward, gradient, pullback and soft pullback match the PyTorch goldens") {
  Temperatures half;
  half.attention = 0.5f;
  for (const auto& [key, causal] : {std::pair{std::string("attn"), false}, std::pair{std::string("attn_causal"), true},
                                    std::pair{std::string("attn_causal_rect"), true}}) {
    const float scale = golden_t(key + ".scale").item();
    auto in = leaves({golden_t(key + ".q"), golden_t(key + ".k"), golden_t(key + ".v")});
    const Tensor u = golden_t(key + ".u");
    Tensor y = attend(in, causal, scale);
    check_close(y, golden_t(key + ".y"), 1e-4, 1e-5, key + " forward");
    auto g = grad(y, in, u);
    check_close(g[0], golden_t(key + ".grad_q"), 1e-4, 1e-5, key + " grad q");
    check_close(g[1], golden_t(key + ".grad_k"), 1e-4, 1e-5, key + " grad k");
    check_close(g[2], golden_t(key + ".grad_v"), 1e-4, 1e-5, key + " grad v");
    check_close(grad(y, {in[2]}, u, Transport::pullback())[0], golden_t(key + ".pullback_v"), 1e-4, 1e-5,
                key + " pullback v");
    check_close(grad(y, {in[2]}, u, Transport::soft_pullback(half))[0], golden_t(key + ".soft_tau05_v"), 1e-4, 1e-5,
                key + " soft pullback v, tau 0.5");
  }
}

TEST_CASE("attention: transports against their definitions") {
  const Tensor q = random_tensor({2, 3, 5, 4}, 11, -2, 2), k = random_tensor({2, 3, 6, 4}, 12, -2, 2),
               v = random_tensor({2, 3, 6, 3}, 13), u = random_tensor({2, 3, 5, 3}, 14);
  const double scale = 0.5;  // the default 1/sqrt(d), d = 4
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    auto in = leaves({q, k, v});
    Tensor y = attend(in, causal);

    // Pullback: nothing reaches q and k; v receives Aᵀu.
    auto p = grad(y, in, u, Transport::pullback());
    check_close(p[0], Tensor::zeros(q.shape()), 0, 0, "pullback q");
    check_close(p[1], Tensor::zeros(k.shape()), 0, 0, "pullback k");
    check_close(p[2], pattern_transposed_times(q, k, v, u, scale, causal), 1e-5, 1e-6,
                "pullback v = Aᵀu");
    // With A frozen the output is linear in v, so <pullback(u), v> = <u, y>.
    std::vector<float> pv = p[2].to_vector(), vv = v.to_vector(), uv = u.to_vector(), yv = y.to_vector();
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < pv.size(); ++i) lhs += double(pv[i]) * vv[i];
    for (size_t i = 0; i < uv.size(); ++i) rhs += double(uv[i]) * yv[i];
    CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));

    // Soft pullback: the pattern recomputed at tau, through v only.
    Temperatures t;
    t.attention = 2.5f;
    auto s = grad(y, in, u, Transport::soft_pullback(t));
    check_close(s[0], Tensor::zeros(q.shape()), 0, 0, "soft q");
    check_close(s[1], Tensor::zeros(k.shape()), 0, 0, "soft k");
    check_close(s[2], pattern_transposed_times(q, k, v, u, scale, causal, 2.5), 1e-5, 1e-6,
                "soft v = A_tauᵀu");
    // At the default tau = 1 the recomputed pattern is the forward one.
    check_close(grad(y, {in[2]}, u, Transport::soft_pullback())[0], p[2], 1e-6, 1e-7, "soft at tau 1 = pullback");

    // The gradient's v cotangent is the pullback's; q and k get non-zero cotangents.
    auto g = grad(y, in, u);
    check_close(g[2], p[2], 0, 0, "gradient v = pullback v");
    for (size_t i = 0; i < 2; ++i) {
      double norm = 0;
      for (float e : g[i].to_vector()) norm += double(e) * e;
      CHECK(norm > 1e-4);
    }
  }
}

TEST_CASE("attention: the causal mask hides later keys") {
  const Tensor q = random_tensor({1, 1, 3, 2}, 21), k = random_tensor({1, 1, 3, 2}, 22),
               v = random_tensor({1, 1, 3, 4}, 23);
  Tensor y = scaled_dot_product_attention(q, k, v, true);
  for (int64_t c = 0; c < 4; ++c) CHECK(y.at({0, 0, 0, c}) == doctest::Approx(v.at({0, 0, 0, c})));
  // Changing the last key and value leaves the first two queries' outputs alone.
  Tensor k2 = k.clone(), v2 = v.clone();
  k2.data()[4] += 3, v2.data()[8] -= 5;
  Tensor y2 = scaled_dot_product_attention(q, k2, v2, true);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t c = 0; c < 4; ++c) CHECK(y2.at({0, 0, i, c}) == y.at({0, 0, i, c}));
  CHECK(y2.at({0, 0, 2, 0}) != y.at({0, 0, 2, 0}));
}

TEST_CASE("attention: bad shapes are errors naming the op and shapes") {
  const Tensor q = Tensor::ones({2, 2, 4, 3});
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, Tensor::ones({2, 2, 5, 4}), Tensor::ones({2, 2, 5, 2})),
                       doctest::Contains("scaled_dot_product_attention: q and k head sizes differ: q [2, 2, 4, 3], "
                                         "k [2, 2, 5, 4], v [2, 2, 5, 2]"),
                       Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, Tensor::ones({2, 2, 5, 3}), Tensor::ones({2, 2, 6, 2})),
                       doctest::Contains("k and v key counts differ"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, Tensor::ones({2, 3, 5, 3}), Tensor::ones({2, 3, 5, 2})),
                       doctest::Contains("leading (batch, head) dims differ"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, Tensor::ones({2, 5, 3}), Tensor::ones({2, 5, 2})),
                       doctest::Contains("same rank"), Error);
}

namespace {

// The packed op's definition: split qkv (B, T, 3·D) into heads as timm does, attend, and put
// the heads back side by side, with the engine's explicit layout ops.
Tensor attend_split_heads(const Tensor& qkv, int64_t heads, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, dh = D / heads;
  Tensor split = permute(reshape(qkv, {B, T, 3, heads, dh}), {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) { return squeeze(slice(split, 0, i, i + 1), 0); };
  Tensor o = scaled_dot_product_attention(part(0), part(1), part(2), causal);
  return reshape(transpose(o, 1, 2), {B, T, D});
}

}  // namespace

TEST_CASE("packed qkv attention: gradcheck, with and without the causal mask") {
  const Tensor qkv = random_tensor({2, 4, 12}, 31, -1.5, 1.5);  // dim 4, 2 heads of 2
  check_gradients([](const std::vector<Tensor>& in) { return packed_qkv_attention(in[0], 2, false); }, {qkv});
  check_gradients([](const std::vector<Tensor>& in) { return packed_qkv_attention(in[0], 2, true); }, {qkv});
}

TEST_CASE("packed qkv attention: forward and every transport equal attention on the split heads") {
  const Tensor qkv = random_tensor({3, 5, 18}, 41, -2, 2), u = random_tensor({3, 5, 6}, 42);  // 3 heads of 2
  Temperatures hot;
  hot.attention = 2.5f;
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    auto packed_in = leaves({qkv}), split_in = leaves({qkv});
    Tensor packed = packed_qkv_attention(packed_in[0], 3, causal);
    Tensor split = attend_split_heads(split_in[0], 3, causal);
    check_close(packed, split, 1e-6, 1e-7, "forward");
    for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(hot),
                               Transport::guided()}) {
      INFO("transport ", to_string(t.kind));
      const Tensor got = grad(packed, packed_in, u, t)[0], want = grad(split, split_in, u, t)[0];
      check_close(got, want, 1e-5, 1e-6, "qkv cotangent");
      // The pullbacks reach v only: the q and k columns of the cotangent are exactly zero.
      double qk_norm = 0, v_norm = 0;
      const std::vector<float> g = got.to_vector();
      for (size_t i = 0; i < g.size(); ++i) (i % 18 < 12 ? qk_norm : v_norm) += double(g[i]) * g[i];
      CHECK(v_norm > 1e-4);
      if (t.is_gradient()) CHECK(qk_norm > 1e-4);
      else CHECK(qk_norm == 0);
    }
  }
}

// packed_kv_attention's definition: queries q (B, Tq, D) and keys and values kv (B, S, 2·D)
// split into heads, attended, and put back side by side.
Tensor attend_split_kv(const Tensor& q, const Tensor& kv, int64_t heads) {
  const int64_t B = q.size(0), T = q.size(1), S = kv.size(1), D = q.size(2), dh = D / heads;
  Tensor queries = permute(reshape(q, {B, T, heads, dh}), {0, 2, 1, 3});
  Tensor split = permute(reshape(kv, {B, S, 2, heads, dh}), {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) { return squeeze(slice(split, 0, i, i + 1), 0); };
  Tensor o = scaled_dot_product_attention(queries, part(0), part(1), false);
  return reshape(transpose(o, 1, 2), {B, T, D});
}

TEST_CASE("packed kv attention: gradcheck, and forward and every transport equal attention on split heads") {
  check_gradients([](const std::vector<Tensor>& in) { return packed_kv_attention(in[0], in[1], 2); },
                  {random_tensor({2, 2, 4}, 51, -1.5, 1.5), random_tensor({2, 5, 8}, 52, -1.5, 1.5)});
  const Tensor q = random_tensor({3, 2, 6}, 53, -2, 2), kv = random_tensor({3, 5, 12}, 54, -2, 2);
  const Tensor u = random_tensor({3, 2, 6}, 55);
  Temperatures hot;
  hot.attention = 2.5f;
  auto packed_in = leaves({q, kv}), split_in = leaves({q, kv});
  Tensor packed = packed_kv_attention(packed_in[0], packed_in[1], 3);
  Tensor split = attend_split_kv(split_in[0], split_in[1], 3);
  check_close(packed, split, 1e-6, 1e-7, "forward");
  for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(hot)}) {
    INFO("transport ", to_string(t.kind));
    const auto got = grad(packed, packed_in, u, t), want = grad(split, split_in, u, t);
    check_close(got[0], want[0], 1e-5, 1e-6, "q cotangent");
    check_close(got[1], want[1], 1e-5, 1e-6, "kv cotangent");
    CHECK(max_abs(got[1]) > 1e-3);
    CHECK((max_abs(got[0]) > 1e-3) == t.is_gradient());  // the pullbacks hold the pattern: nothing to q
  }
  CHECK_THROWS_WITH_AS(packed_kv_attention(Tensor::ones({2, 1, 4}), Tensor::ones({2, 5, 6}), 2),
                       doctest::Contains("packed_kv_attention: expects q (batch, queries, dim) and kv (batch, "
                                         "tokens, 2·dim), got q [2, 1, 4] and kv [2, 5, 6]"),
                       Error);
  CHECK_THROWS_WITH_AS(packed_kv_attention(Tensor::ones({2, 1, 4}), Tensor::ones({2, 5, 8}), 3),
                       doctest::Contains("dim 4 (q [2, 1, 4]) is not divisible by 3 heads"), Error);
}

TEST_CASE("packed qkv attention: bad shapes are errors naming the op and shape") {
  CHECK_THROWS_WITH_AS(packed_qkv_attention(Tensor::ones({2, 4, 10}), 2),
                       doctest::Contains("packed_qkv_attention: expects qkv (batch, tokens, 3·dim), got [2, 4, 10]"),
                       Error);
  CHECK_THROWS_WITH_AS(packed_qkv_attention(Tensor::ones({2, 4, 12}), 3),
                       doctest::Contains("dim 4 (qkv [2, 4, 12]) is not divisible by 3 heads"), Error);
  CHECK_THROWS_WITH_AS(packed_qkv_attention(Tensor::ones({4, 12}), 2), doctest::Contains("got [4, 12]"), Error);
}

TEST_CASE("packed qkv attention: the same bits at 1 and 2 threads, forward and every transport, with the heads "
          "split between threads") {
  // 4 images × 6 heads: the heads run in parallel, each through its products and softmax.
  const Tensor qkv = random_tensor({4, 23, 3 * 48}, 61, -2, 2), u = random_tensor({4, 23, 48}, 62);
  Temperatures hot;
  hot.attention = 2.5f;
  const int saved = num_threads();
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    std::vector<float> forward[2];
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      NoGrad no_grad;
      forward[threads - 1] = packed_qkv_attention(qkv, 6, causal).to_vector();
    }
    CHECK(forward[0] == forward[1]);
    for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(hot)}) {
      INFO("transport ", to_string(t.kind));
      std::vector<float> recorded[2], cotangent[2];
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        auto in = leaves({qkv});
        const Tensor y = packed_qkv_attention(in[0], 6, causal);
        recorded[threads - 1] = y.to_vector();
        cotangent[threads - 1] = grad(y, in, u, t)[0].to_vector();
      }
      CHECK(recorded[0] == forward[0]);  // recorded or not, the same forward
      CHECK(recorded[0] == recorded[1]);
      CHECK(cotangent[0] == cotangent[1]);
      CHECK(max_abs(Tensor::from_vector(qkv.shape(), cotangent[0])) > 1e-3);
    }
  }
  set_num_threads(saved);
}
