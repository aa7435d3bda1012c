// End-to-end evidence that the engine learns: a small CNN and a small MLP trained on
// synthetic tasks made in code, and bitwise reproducibility of training.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "ops/activation.h"
#include "ops/conv.h"
#include "ops/layout.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

// Bars: 1×8×8 images holding a horizontal (class 0) or vertical (class 1) bar at a
// random position, or a diagonal (class 2), in noise.
void make_bars(int64_t n, Generator& gen, Tensor& images, std::vector<int64_t>& labels) {
  images = normal({n, 1, 8, 8}, 0.0f, 0.3f, gen);
  labels.assign(size_t(n), 0);
  float* p = images.data();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cls = randint(3, gen), at = randint(8, gen);
    labels[size_t(i)] = cls;
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t r = cls == 0 ? at : j, c = cls == 0 ? j : cls == 1 ? at : (j + at) % 8;
      p[i * 64 + r * 8 + c] += 1.5f;
    }
  }
}

// Two interleaved spirals in 2-D: not linearly separable.
void make_spirals(int64_t n, Generator& gen, Tensor& points, std::vector<int64_t>& labels) {
  Tensor t = uniform({n}, 0.25f, 1.0f, gen);
  Tensor noise = normal({n, 2}, 0.0f, 0.03f, gen);
  points = Tensor::empty({n, 2});
  labels.assign(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cls = i % 2;
    const float r = t.data()[i], angle = 3.0f * float(M_PI) * r + float(M_PI) * float(cls);
    points.data()[2 * i] = r * std::cos(angle) + noise.data()[2 * i];
    points.data()[2 * i + 1] = r * std::sin(angle) + noise.data()[2 * i + 1];
    labels[size_t(i)] = cls;
  }
}

// Kaiming-uniform initial weights, as torch's default for conv and linear layers.
Tensor init_weight(const Shape& shape, int64_t fan_in, Generator& gen) {
  const float bound = 1.0f / std::sqrt(float(fan_in));
  return uniform(shape, -bound, bound, gen);
}

struct SmallCnn : Module {
  Tensor c1, b1, c2, b2, fc, fb;
  explicit SmallCnn(Generator& gen) {
    c1 = register_parameter("conv1.weight", init_weight({8, 1, 3, 3}, 9, gen));
    b1 = register_parameter("conv1.bias", init_weight({8}, 9, gen));
    c2 = register_parameter("conv2.weight", init_weight({16, 8, 3, 3}, 72, gen));
    b2 = register_parameter("conv2.bias", init_weight({16}, 72, gen));
    fc = register_parameter("fc.weight", init_weight({3, 16 * 4 * 4}, 256, gen));
    fb = register_parameter("fc.bias", init_weight({3}, 256, gen));
  }
  Tensor forward(const Tensor& x) const {
    Conv2dOptions same;
    same.pad_h = same.pad_w = 1;
    Tensor h = relu(conv2d(x, c1, b1, same));
    h = max_pool2d(relu(conv2d(h, c2, b2, same)), 2, 2);
    return linear(flatten(h, 1), fc, fb);
  }
};

struct SmallMlp : Module {
  Tensor w1, b1, w2, b2, w3, b3;
  explicit SmallMlp(Generator& gen) {
    w1 = register_parameter("0.weight", init_weight({64, 2}, 2, gen));
    b1 = register_parameter("0.bias", init_weight({64}, 2, gen));
    w2 = register_parameter("2.weight", init_weight({64, 64}, 64, gen));
    b2 = register_parameter("2.bias", init_weight({64}, 64, gen));
    w3 = register_parameter("4.weight", init_weight({2, 64}, 64, gen));
    b3 = register_parameter("4.bias", init_weight({2}, 64, gen));
  }
  Tensor forward(const Tensor& x) const {
    return linear(relu(linear(relu(linear(x, w1, b1)), w2, b2)), w3, b3);
  }
};

float accuracy(const Tensor& logits, const std::vector<int64_t>& labels) {
  const int64_t n = logits.size(0), c = logits.size(1);
  Tensor l = logits.contiguous();
  int64_t right = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t k = 1; k < c; ++k)
      if (l.data()[i * c + k] > l.data()[i * c + best]) best = k;
    right += best == labels[size_t(i)];
  }
  return float(right) / float(n);
}

// Trains the CNN for `steps` SGD steps and returns its final loss.
float train_cnn(SmallCnn& net, int64_t steps, uint64_t seed) {
  Generator data_gen(seed);
  Sgd opt(net.named_parameters(), SgdOptions{0.05, 0.9, 0.0, true});
  float loss_value = 0;
  for (int64_t s = 0; s < steps; ++s) {
    Tensor x;
    std::vector<int64_t> y;
    make_bars(32, data_gen, x, y);
    opt.zero_grad();
    Tensor loss = cross_entropy(net.forward(x), y);
    backward(loss);
    opt.step();
    loss_value = loss.item();
  }
  return loss_value;
}

}  // namespace

TEST_CASE("learning: a small CNN learns oriented bars (loss < 0.1, accuracy > 97%)") {
  Generator init(7);
  SmallCnn net(init);
  Generator test_gen(99);
  Tensor xt;
  std::vector<int64_t> yt;
  make_bars(512, test_gen, xt, yt);
  float initial;
  {
    NoGrad off;
    initial = cross_entropy(net.forward(xt), yt).item();
  }
  train_cnn(net, 300, 1);
  NoGrad off;
  Tensor logits = net.forward(xt);
  const float final_loss = cross_entropy(logits, yt).item();
  INFO("initial loss ", initial, ", final loss ", final_loss);
  CHECK(initial > 0.9f);  // ≈ ln 3 at initialisation
  CHECK(final_loss < 0.1f);
  CHECK(accuracy(logits, yt) > 0.97f);
}

TEST_CASE("learning: a small MLP with AdamW separates two spirals (accuracy > 95%)") {
  Generator gen(3);
  SmallMlp net(gen);
  Tensor x;
  std::vector<int64_t> y;
  make_spirals(512, gen, x, y);
  AdamW opt(net.named_parameters(), AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 1e-4});
  float first = 0, last = 0;
  for (int step = 0; step < 600; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(net.forward(x), y);
    backward(loss);
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  NoGrad off;
  INFO("loss ", first, " -> ", last);
  CHECK(last < 0.15f);
  CHECK(accuracy(net.forward(x), y) > 0.95f);
}

TEST_CASE("learning: training is bitwise reproducible at a fixed seed and thread count") {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      Generator init(11);
      SmallCnn net(init);
      train_cnn(net, 20, 5);
      std::vector<float> all;
      for (auto& [name, p] : net.named_parameters()) {
        std::vector<float> v = p.to_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      runs.push_back(all);
    }
    INFO("threads ", threads);
    CHECK(runs[0] == runs[1]);
  }
  set_num_threads(0);
}

TEST_CASE("freeze: eval mode, no parameter gradient, and the input gradient unchanged") {
  Generator init(3), data_gen(4);
  SmallCnn net(init);
  Tensor x;
  std::vector<int64_t> y;
  make_bars(4, data_gen, x, y);
  // The input gradient of the live model (its parameters still ask for gradients).
  Tensor live_input = x.clone().requires_grad_(true);
  backward(cross_entropy(net.forward(live_input), y));
  for (auto& [name, p] : net.named_parameters()) REQUIRE(p.grad().defined());
  net.zero_grad();
  const std::vector<float> params_before = [&] {
    std::vector<float> all;
    for (auto& [name, p] : net.named_parameters()) for (float v : p.to_vector()) all.push_back(v);
    return all;
  }();

  net.freeze();
  CHECK_FALSE(net.training());
  Tensor frozen_input = x.clone().requires_grad_(true);
  backward(cross_entropy(net.forward(frozen_input), y));
  for (auto& [name, p] : net.named_parameters()) {
    INFO(name);
    CHECK_FALSE(p.requires_grad());
    CHECK((!p.grad().defined() || testing::max_abs(p.grad()) == 0.0));
  }
  CHECK(testing::max_abs(live_input.grad()) > 0.0);
  CHECK(frozen_input.grad().to_vector() == live_input.grad().to_vector());
  std::vector<float> params_after;
  for (auto& [name, p] : net.named_parameters()) for (float v : p.to_vector()) params_after.push_back(v);
  CHECK(params_after == params_before);
}
