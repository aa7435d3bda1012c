// engine/flops.h: the nominal FLOPs that `adjoint bench models` sets beside the sgemm rate,
// against counts worked out by hand.
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/flops.h"
#include "engine/random.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/bilinear.h"
#include "ops/conv.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

TEST_CASE("flops: a tiny conv-relu-pool-linear model counts 2 per multiply-add of its products") {
  const Tensor x = random_tensor({2, 3, 5, 5}, 1);
  const Tensor w = random_tensor({4, 3, 3, 3}, 2), b = random_tensor({4}, 3);
  const Tensor fc = random_tensor({10, 16}, 4), fc_bias = random_tensor({10}, 5);
  NoGrad off;
  FlopCount count;
  // conv 3→4, 3×3, stride 2, padding 1: 5×5 → 3×3. Each of the 2·4·3·3 = 72 outputs sums
  // 3·3·3 = 27 products: 1944 multiply-adds, 3888 FLOPs. The bias, the ReLU and the pool
  // count nothing.
  Tensor h = relu(conv2d(x, w, b, Conv2dOptions::square(2, 1)));
  CHECK(count.total() == 3888);
  h = flatten(max_pool2d(h, 2, 1, 0), 1);  // (2, 4·2·2 = 16)
  CHECK(count.total() == 3888);
  // linear 16 → 10 on 2 rows: 320 multiply-adds.
  linear(h, fc, fc_bias);
  CHECK(count.total() == 3888 + 640);
}

TEST_CASE("flops: grouped and pointwise convs, matmul, attention and bilinear layers") {
  NoGrad off;
  FlopCount count;
  // groups 2, 4→6 channels, 1×1 on 4×4, batch 1: 16 positions · 6 outputs · 2 inputs each.
  conv2d(random_tensor({1, 4, 4, 4}, 1), random_tensor({6, 2, 1, 1}, 2), {}, Conv2dOptions::square(1).with_groups(2));
  CHECK(count.total() == 2 * 16 * 6 * 2);
  const int64_t after_conv = count.total();
  // A batch of 3 products (2×5)·(5×4): 3·2·4·5 = 120 multiply-adds.
  matmul(random_tensor({3, 2, 5}, 3), random_tensor({3, 5, 4}, 4));
  CHECK(count.total() - after_conv == 240);
  const int64_t after_matmul = count.total();
  // Attention, 2 heads, 3 queries, 4 keys, head size 5, values of size 6:
  // Q·Kᵀ 2·3·4·5 = 120 and A·V 2·3·4·6 = 144 multiply-adds.
  scaled_dot_product_attention(random_tensor({2, 3, 5}, 5), random_tensor({2, 4, 5}, 6), random_tensor({2, 4, 6}, 7));
  CHECK(count.total() - after_matmul == 2 * (120 + 144));
  const int64_t after_attention = count.total();
  // Bilinear 3 → 7 on 4 rows: two projections of 4·7·3 multiply-adds each.
  bilinear(random_tensor({4, 3}, 8), random_tensor({7, 4}, 9), random_tensor({7, 4}, 10));
  CHECK(count.total() - after_attention == 2 * 2 * 4 * 7 * 3);
}

TEST_CASE("flops: a ViT's nominal count comes from running every block in full") {
  ModelConfig c;
  c.arch = "vit_custom", c.dim = 48, c.depth = 2, c.heads = 3, c.patch = 4, c.image_size = 16, c.in_channels = 3;
  Generator gen(3);
  auto model = make_model(c, gen);
  const Tensor x = random_tensor({1, 3, 16, 16}, 4);
  NoGrad off;
  // 17 tokens of 48. Patch embedding: 16 positions · 48 outputs · 3·4·4 inputs. A block, per
  // token: qkv 48·144, proj 48·48, fc1 and fc2 48·192 each; attention 3 heads · 17 queries
  // · 17 keys · (16 + 16). The head: 48·10 for the class token.
  const int64_t patch = 16 * 48 * 48, block = 17 * (48 * 144 + 48 * 48 + 2 * 48 * 192) + 3 * 17 * 17 * 32;
  int64_t nominal = 0, performed = 0;
  {
    FlopCount count;
    model->trace(x, 0, model->num_blocks());
    nominal = count.total();
  }
  CHECK(nominal == 2 * (patch + 2 * block + 48 * 10));
  {
    FlopCount count;
    model->forward(x);
    performed = count.total();
  }
  // forward() runs the last block for the class token alone: its query, projections and MLP
  // for 1 token, keys and values for all 17, and 1 query's attention.
  const int64_t last = 48 * 48 + 17 * 48 * 96 + 3 * 17 * 32 + 48 * 48 + 2 * 48 * 192;
  CHECK(performed == 2 * (patch + block + last + 48 * 10));
}

TEST_CASE("flops: one count runs at a time, and a new count starts from zero") {
  const Tensor a = random_tensor({4, 4}, 1);
  {
    FlopCount count;
    matmul(a, a);
    CHECK(count.total() == 2 * 64);
    CHECK_THROWS_AS(FlopCount(), Error);
  }
  FlopCount again;
  CHECK(again.total() == 0);
}
