// linear's forward on the engine's AVX-512 kernel with the weights packed once per version
// (engine/gemm.h PackedB, kept with them) and an activation applied by the product
// (linear_activation, GemmEpilogue::map), on that kernel and on OpenBLAS's whatever the route
// table chooses (LinearForwardKernel): the bits of the unpacked product and of the separate
// ops, at 1 and 2 threads; the reference and finite differences; a write to the weights (an
// optimiser step, a load) gives the new answer.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/reference/reference.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

void gelu_row(const float* z, float* y, int64_t n) { activation_values(z, y, n, Activation::Gelu); }

// A layer as wide as ViT-B/16's MLP, on rows that leave edge tiles: shapes linear's route
// table sends to the engine's kernel.
constexpr int64_t kRows = 262, kIn = 768, kOut = 3072 + 40;

}  // namespace

TEST_CASE("PackedB: products with op(B) packed once give the bits of the unpacked product, split or not") {
  if (!avx512_gemm_available()) return;
  // Edge columns (N not a multiple of 32), three depth blocks, rows split at 2 threads; bias,
  // residual and a map in place or elsewhere.
  const ThreadCount restore;
  const int64_t M = 300, N = 1100, K = 600, ldc = N + 3;
  const Tensor a = random_tensor({M, K}, 1), b = random_tensor({N, K}, 2), bias = random_tensor({N}, 3),
               residual = random_tensor({M, N}, 4);
  const std::vector<float> A = a.to_vector(), B = b.to_vector(), vb = bias.to_vector(), vr = residual.to_vector();
  const PackedB packed(true, K, N, B.data(), K);
  for (int terms = 0; terms < 4; ++terms)
    for (const bool in_place : {true, false}) {
      CAPTURE(terms);
      CAPTURE(in_place);
      set_num_threads(1);
      std::vector<float> want(size_t(M * ldc), 0.0f), want_mapped(size_t(M * ldc), 0.0f);
      GemmEpilogue epilogue{terms & 1 ? vb.data() : nullptr, terms & 2 ? vr.data() : nullptr, N};
      gemm_with_epilogue(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, epilogue, want.data(), ldc,
                         GemmKernel::widest);
      for (int64_t i = 0; i < M; ++i) gelu_row(want.data() + i * ldc, want_mapped.data() + i * ldc, N);
      for (const int threads : {1, 2}) {
        CAPTURE(threads);
        set_num_threads(threads);
        std::vector<float> C(size_t(M * ldc), 0.0f), mapped(size_t(M * ldc), 0.0f);
        GemmEpilogue with_map = epilogue;
        with_map.map = gelu_row, with_map.mapped = in_place ? C.data() : mapped.data(), with_map.ldm = ldc;
        gemm_with_epilogue(M, 1.0f, A.data(), K, packed, with_map, C.data(), ldc);
        CHECK((in_place ? C : mapped) == want_mapped);
        if (!in_place) CHECK(C == want);
        std::vector<float> plain(size_t(M * ldc), 0.0f);
        gemm_with_epilogue(M, 1.0f, A.data(), K, packed, epilogue, plain.data(), ldc);
        CHECK(plain == want);
      }
    }
}

TEST_CASE("linear_activation: the bits of linear then the activation, the reference, every transport") {
  // Forward against the double-precision reference; the bits of gelu(linear(…)) and the
  // same vector-Jacobian products under every transport, at 1 and 2 threads.
  const ThreadCount restore;
  for (const GemmKernel kernel : {GemmKernel::blas, GemmKernel::widest}) {
  CAPTURE(int(kernel));
  const LinearForwardKernel route(kernel);
  const Tensor x = random_tensor({2, kRows / 2, kIn}, 11), w = random_tensor({kOut, kIn}, 12, -0.05f, 0.05f),
               b = random_tensor({kOut}, 13), u = random_tensor({2, kRows / 2, kOut}, 14);
  auto fused = [](const std::vector<Tensor>& v) { return linear_activation(v[0], v[1], v[2], Activation::Gelu); };
  auto fused_kept = [](const std::vector<Tensor>& v) {
    return linear_activation(v[0], v[1], v[2], Activation::Gelu, true);
  };
  auto apart = [](const std::vector<Tensor>& v) { return gelu(linear(v[0], v[1], v[2])); };
  std::vector<std::vector<float>> bits;
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    const Tensor y = fused({x, w, b});
    CHECK(y.to_vector() == apart({x, w, b}).to_vector());
    CHECK(fused_kept({x, w, b}).to_vector() == y.to_vector());
    bits.push_back(y.to_vector());
    if (threads == 1) {
      using namespace reference;
      const Values z = linear_forward(values(x), values(w), values(b), kRows, kIn, kOut);
      check_close(y, to_tensor(y.shape(), activation_forward(z, Activation::Gelu)), 1e-5, 1e-5, "forward");
    }
    for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback()}) {
      CAPTURE(to_string(t.kind));
      const std::vector<Tensor> want = vjp(apart, {x, w, b}, u, t);
      using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
      for (const Fn& f : {Fn(fused), Fn(fused_kept)}) {
        const std::vector<Tensor> got = vjp(f, {x, w, b}, u, t);
        for (size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);
          CHECK(max_abs(got[i]) > 0.1);
          CHECK(got[i].to_vector() == want[i].to_vector());
        }
      }
    }
  }
  CHECK(bits[0] == bits[1]);
  {
    NoGrad off;  // outside a graph the activation overwrites the product's output in place
    CHECK(fused({x, w, b}).to_vector() == bits[0]);
  }
  // Finite differences on small shapes.
  check_gradients(fused, {random_tensor({2, 3, 4}, 15), random_tensor({5, 4}, 16), random_tensor({5}, 17)});
  }
}

TEST_CASE("linear: weights packed once per version; a write gives the new answer") {
  // Inference on a routed shape, keeping the packed weights, keeps one form; writing them
  // (through data(), as an optimiser does) drops it, and the next call gives the bits of a
  // fresh weight tensor packed per call.
  const LinearForwardKernel route(GemmKernel::widest);
  const Tensor x = random_tensor({kRows, kIn}, 21);
  Tensor w = random_tensor({kOut, kIn}, 22, -0.05f, 0.05f);
  const Tensor b = random_tensor({kOut}, 23);
  NoGrad off;
  const std::vector<float> first = linear(x, w, b, {}, {}, true).to_vector();
  CHECK(linear(x, w, b, {}, {}, true).to_vector() == first);
  CHECK(linear(x, w.clone(), b).to_vector() == first);  // packed per call, not kept
  if (avx512_gemm_available()) CHECK(forms_kept(w) == 1);
  w.data()[5] += 0.5f;
  CHECK(forms_kept(w) == 0);
  const std::vector<float> second = linear(x, w, b, {}, {}, true).to_vector();
  CHECK(second != first);
  CHECK(second == linear(x, w.clone(), b).to_vector());
  CHECK(linear_activation(x, w, b, Activation::Gelu, true).to_vector() ==
        gelu(linear(x, w.clone(), b)).to_vector());
}

TEST_CASE("linear: a ViT whose weights change after a pass gives a fresh model's answer") {
  // Two blocks as wide as ViT-B's (768, MLP 3072; the last computes the class token's rows
  // alone) on 4 images of 65 tokens (260 rows): a pass, an
  // SGD step, another pass, against a fresh model with the stepped weights loaded; the same
  // after a load.
  const LinearForwardKernel route(GemmKernel::widest);
  ModelConfig config;
  config.arch = "vit_custom", config.dim = 768, config.depth = 2, config.heads = 12, config.patch = 4;
  config.image_size = 32, config.in_channels = 3, config.num_classes = 10;
  check_kept_forms_follow_writes(config, 31, random_tensor({4, 3, 32, 32}, 32), "mlp", avx512_gemm_available());
}
