// Explanation methods (analysis/pullbacks/explain.h) and the two attribution transports (Guided,
// DeepLift): every method against a PyTorch reference on the same weights
// (tests/goldens/gen_explain.py), and the properties that define them.
#include <doctest/doctest.h>

#include <cmath>

#include "analysis/pullbacks/explain.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/random.h"
#include "models/checkpoint.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/pool.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// gen_explain.py's TinyCnn: conv-BN-ReLU-maxpool ×2, conv-BN-ReLU, average pool, linear.
class TinyCnn : public Model {
public:
  explicit TinyCnn(Generator& gen) : Model(tiny_config()) {
    auto features = register_module("features", std::make_shared<Module>());
    Conv2dOptions same;
    same.pad_h = same.pad_w = 1;
    const int64_t widths[] = {6, 8, 8}, torch_index[] = {0, 4, 8};
    int64_t in = 3;
    for (int u = 0; u < 3; ++u) {
      auto conv = features->register_module(std::to_string(torch_index[u]),
                                            std::make_shared<Conv2d>(in, widths[u], 3, same, true, gen));
      auto bn = features->register_module(std::to_string(torch_index[u] + 1), std::make_shared<BatchNorm>(widths[u]));
      const bool pool = u < 2;
      add_block(cat("conv", u + 1), [conv, bn, pool](const Tensor& x) {
        Tensor h = relu(bn->forward(conv->forward(x)));
        return pool ? max_pool2d(h, 2, 2) : h;
      });
      in = widths[u];
    }
    auto fc = register_module("fc", std::make_shared<Linear>(in, 5, true, gen));
    add_block("head", [fc](const Tensor& x) { return fc->forward(flatten(adaptive_avg_pool2d(x, 1, 1), 1)); });
  }

private:
  static ModelConfig tiny_config() {
    ModelConfig c;
    c.arch = "tiny_cnn";
    c.num_classes = 5;
    return c;
  }
};

// A network without any nonlinearity: conv, BN (eval), average pool, linear.
class LinearNet : public Model {
public:
  explicit LinearNet(Generator& gen) : Model(ModelConfig{}) {
    Conv2dOptions same;
    same.pad_h = same.pad_w = 1;
    auto conv = register_module("conv", std::make_shared<Conv2d>(2, 4, 3, same, true, gen));
    auto bn = register_module("bn", std::make_shared<BatchNorm>(4));
    bn->running_mean.copy_from(uniform({4}, -0.5f, 0.5f, gen));
    bn->running_var.copy_from(uniform({4}, 0.5f, 1.5f, gen));
    auto fc = register_module("fc", std::make_shared<Linear>(4 * 4, 3, true, gen));
    add_block("features", [conv, bn](const Tensor& x) { return bn->forward(conv->forward(x)); });
    add_block("head", [fc](const Tensor& x) { return fc->forward(flatten(avg_pool2d(x, 2, 2), 1)); });
  }
};

std::shared_ptr<Model> fixture_model(const std::string& name) {
  Generator gen(7);
  std::shared_ptr<Model> model;
  if (name == "cnn") {
    model = std::make_shared<TinyCnn>(gen);
  } else {
    ModelConfig c;
    c.arch = "vit_custom", c.num_classes = 5, c.in_channels = 3, c.image_size = 8, c.patch = 4;
    c.dim = 16, c.depth = 2, c.heads = 2, c.mlp_ratio = 2;
    model = make_model(c, gen);
  }
  std::map<std::string, Tensor> weights;
  const std::string prefix = name + ".weights.";
  for (const auto& [key, t] : fixture("explain").tensors)
    if (key.rfind(prefix, 0) == 0) weights[key.substr(prefix.size())] = t;
  load_state_dict(*model, weights, "explain fixture (" + name + ")");
  model->train(false);
  return model;
}

std::vector<int64_t> fixture_targets(const std::string& name) {
  std::vector<int64_t> targets;
  for (float v : golden("explain", name + ".targets").to_vector()) targets.push_back(static_cast<int64_t>(v));
  return targets;
}

// A case of the fixture: the model, its input batch "<name>.x" and the target classes.
struct FixtureCase {
  std::shared_ptr<Model> model;
  Tensor x;
  std::vector<int64_t> targets;
};

FixtureCase fixture_case(const std::string& name) {
  return {fixture_model(name), golden("explain", name + ".x"), fixture_targets(name)};
}

// Attributions compared relative to their own scale: elementwise within
// rtol·|expected| + rtol·max|expected|.
void check_attribution(const Tensor& actual, const Tensor& expected, double rtol, const std::string& what) {
  check_close(actual, expected, rtol, rtol * max_abs(expected) + 1e-9, what);
}

// Row n of the logits' target column.
std::vector<double> target_logits(const Model& model, const Tensor& x, const std::vector<int64_t>& targets) {
  NoGrad no_grad;
  const Tensor logits = model.forward(x).contiguous();
  std::vector<double> out;
  for (size_t n = 0; n < targets.size(); ++n) out.push_back(logits.at({int64_t(n), targets[n]}));
  return out;
}

// Σ over example n's attribution.
std::vector<double> per_example_sums(const Tensor& attribution) {
  const Tensor a = attribution.contiguous();
  const int64_t N = a.size(0), D = a.numel() / N;
  std::vector<double> out(N, 0.0);
  for (int64_t i = 0; i < a.numel(); ++i) out[i / D] += a.data()[i];
  return out;
}

void check_against_fixture(const std::string& name) {
  const auto [model, x, targets] = fixture_case(name);
  {
    NoGrad no_grad;
    check_close(model->forward(x), golden("explain", name + ".logits"), 1e-4, 1e-5, name + " logits");
  }
  const Tensor baseline = golden("explain", name + ".baseline");
  ExplainOptions base;
  ExplainOptions tau05;
  tau05.temperatures = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  ExplainOptions clip;
  clip.ascent_steps = 3, clip.ascent_alpha = 2.0f, clip.ascent_clip = true;
  ExplainOptions trapezoid;
  trapezoid.ig_steps = 7;
  ExplainOptions gauss = trapezoid;
  gauss.ig_rule = "gauss-legendre";
  gauss.max_batch = 3;  // several passes, the last one partial
  ExplainOptions gauss_baseline = gauss;
  gauss_baseline.baseline = baseline;
  ExplainOptions deeplift_baseline;
  deeplift_baseline.baseline = baseline;
  ExplainOptions second_block;
  second_block.gradcam_block = name == "cnn" ? "conv2" : "blocks.1";

  struct Case {
    std::string method, golden;
    ExplainOptions options;
    double rtol;
  };
  const std::vector<Case> cases = {
      {"gradient", "gradient", base, 1e-4},
      {"input_x_gradient", "input_x_gradient", base, 1e-4},
      {"pullback", "pullback", base, 1e-4},
      {"soft_pullback", "soft_pullback", base, 1e-4},
      {"soft_pullback", "soft_pullback_tau05", tau05, 1e-4},
      {"guided_backprop", "guided_backprop", base, 1e-4},
      {"pullback_ascent", "pullback_ascent", base, 5e-4},
      {"gradient_ascent", "gradient_ascent", base, 5e-4},
      {"pullback_ascent", "pullback_ascent_clip", clip, 5e-4},
      {"integrated_gradients", "ig_trapezoid", trapezoid, 1e-4},
      {"integrated_gradients", "ig_gauss_legendre", gauss, 1e-4},
      {"integrated_gradients", "ig_gauss_legendre_baseline", gauss_baseline, 1e-4},
      {"deeplift", "deeplift", base, 1e-4},
      {"deeplift", "deeplift_baseline", deeplift_baseline, 1e-4},
      {"gradcam", "gradcam0", base, 1e-4},
      {"gradcam", "gradcam1", second_block, 1e-4},
      {"guided_gradcam", "guided_gradcam", base, 1e-4},
  };
  for (const Case& c : cases) {
    const Tensor expected = golden("explain", name + "." + c.golden);
    check_attribution(explain(c.method, *model, x, targets, c.options), expected, c.rtol, name + " " + c.golden);
  }
  const AscentResult pa = ascent(*model, x, targets, base, true);
  check_attribution(pa.counterfactual, golden("explain", name + ".pullback_ascent_xK"), 5e-4, name + " x_K");
  CHECK(default_ascent_alpha(x, base.range) ==
        doctest::Approx(golden("explain", name + ".alpha").item()).epsilon(1e-6));
}

}  // namespace

TEST_CASE("explain: every method matches PyTorch on a tiny CNN (ReLU, max-pool, BN eval)") {
  check_against_fixture("cnn");
}

TEST_CASE("explain: every method matches PyTorch on a tiny ViT (GELU, LayerNorm, attention)") {
  check_against_fixture("vit");
}

TEST_CASE("explain: method names, explainers and predicted classes") {
  const std::vector<std::string> expected = {
      "soft_pullback", "pullback",         "pullback_ascent", "gradient_ascent", "gradient",       "input_x_gradient",
      "smoothgrad",    "integrated_gradients", "guided_backprop", "gradcam",      "guided_gradcam", "deeplift"};
  CHECK(explanation_methods() == expected);
  const auto [model, x, targets] = fixture_case("cnn");
  ExplainOptions o;
  o.smoothgrad_samples = 3;
  o.ig_steps = 3;
  for (const std::string& method : explanation_methods()) {
    INFO(method);
    const Tensor a = explain(method, *model, x, targets, o);
    CHECK(a.shape() == x.shape());
    check_close(make_explainer(method, *model, o)(x, targets), a, 0, 0, method + " explainer");
  }
  // The fixture's logits put both examples on class 4.
  CHECK(predicted_classes(*model, x) == std::vector<int64_t>{4, 4});
}

TEST_CASE("explain: bad requests name the method and what is wrong") {
  auto model = fixture_model("cnn");
  const Tensor x = golden("explain", "cnn.x");
  CHECK_THROWS_WITH_AS(explain("saliency", *model, x, {0, 1}), doctest::Contains("unknown explanation method 'saliency'"),
                       UsageError);
  CHECK_THROWS_WITH_AS(make_explainer("nope", *model), doctest::Contains("known: soft_pullback"), UsageError);
  CHECK_THROWS_WITH_AS(explain("gradient", *model, x, {0}), doctest::Contains("gradient: 1 targets for a batch of 2"),
                       Error);
  CHECK_THROWS_WITH_AS(explain("soft_pullback", *model, x, {0, 5}),
                       doctest::Contains("target class 5 of example 1 is outside [0, 5)"), Error);
  ExplainOptions o;
  o.ig_rule = "simpson";
  CHECK_THROWS_WITH_AS(explain("integrated_gradients", *model, x, {0, 1}, o), doctest::Contains("unknown rule 'simpson'"),
                       UsageError);
  o = {};
  o.baseline = Tensor::zeros({3, 4, 4});
  CHECK_THROWS_WITH_AS(explain("deeplift", *model, x, {0, 1}, o),
                       doctest::Contains("deeplift: baseline [3, 4, 4] matches neither the batch [2, 3, 12, 12]"), Error);
  o = {};
  o.gradcam_block = "head";
  CHECK_THROWS_WITH_AS(explain("gradcam", *model, x, {0, 1}, o), doctest::Contains("'head' is the last one"), Error);
  o.gradcam_block = "conv9";
  CHECK_THROWS_WITH_AS(explain("gradcam", *model, x, {0, 1}, o), doctest::Contains("has no block 'conv9'"), Error);
  {
    NoGrad no_grad;
    CHECK_THROWS_WITH_AS(explain("gradient", *model, x, {0, 1}), doctest::Contains("recording is off"), Error);
  }
  model->train(true);
  CHECK_THROWS_WITH_AS(explain("pullback_ascent", *model, x, {0, 1}),
                       doctest::Contains("pullback_ascent: the model is in training mode"), Error);
}

TEST_CASE("explain: Guided and DeepLift transports of the activations follow their definitions") {
  CHECK(std::string(to_string(TransportKind::Guided)) == "guided");
  CHECK(std::string(to_string(TransportKind::DeepLift)) == "deeplift");
  // Rows 0-1 are inputs, rows 2-3 their baselines; (0,0)/(2,0) coincide (gradient fallback).
  const Tensor z = Tensor::from_vector({4, 3}, {0.3f, -1.2f, 2.0f, -0.4f, 0.8f, 1.5f,  //
                                                0.3f, 0.5f, -1.0f, 0.7f, 0.8f, -2.0f});
  const Tensor u = random_tensor({4, 3}, 11);
  struct Kind {
    Activation kind;
    float (*f)(float);
    float (*df)(float);
  };
  const Kind kinds[] = {
      {Activation::Relu, [](float v) { return std::max(v, 0.0f); }, [](float v) { return v > 0 ? 1.0f : 0.0f; }},
      {Activation::Gelu, [](float v) { return float(v * 0.5 * std::erfc(-v / std::sqrt(2.0))); },
       [](float v) {
         return float(0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI));
       }},
      {Activation::Silu, [](float v) { return float(v / (1 + std::exp(-v))); },
       [](float v) {
         const double s = 1 / (1 + std::exp(-double(v)));
         return float(s + v * s * (1 - s));
       }},
  };
  for (const Kind& k : kinds) {
    INFO(to_string(k.kind));
    auto f = [&](const std::vector<Tensor>& in) { return activation(in[0], k.kind); };
    const Tensor guided = vjp(f, {z}, u, Transport::guided())[0];
    const Tensor rescale = vjp(f, {z}, u, Transport::deeplift())[0];
    std::vector<float> want_guided(12), want_rescale(12);
    for (int64_t i = 0; i < 12; ++i) {
      const float zi = z.data()[i], ui = u.data()[i];
      want_guided[i] = k.df(zi) * std::max(ui, 0.0f);
      const int64_t j = i < 6 ? i : i - 6;  // the input position of the pair
      const float a = z.data()[j], b = z.data()[j + 6];
      want_rescale[i] = (a == b ? k.df(zi) : (k.f(a) - k.f(b)) / (a - b)) * ui;
    }
    check_close(guided, Tensor::from_vector({4, 3}, want_guided), 1e-5, 1e-6, "guided");
    check_close(rescale, Tensor::from_vector({4, 3}, want_rescale), 1e-4, 1e-6, "rescale");
    CHECK_THROWS_WITH_AS(vjp(f, {slice(z, 0, 0, 3)}, slice(u, 0, 0, 3).contiguous(), Transport::deeplift()),
                         doctest::Contains("needs the batch [inputs; baselines]"), Error);
  }
}

TEST_CASE("explain: on a linear network every transport is the gradient") {
  Generator gen(3);
  LinearNet net(gen);
  net.train(false);
  const Tensor x = random_tensor({2, 2, 4, 4}, 5);
  const std::vector<int64_t> targets = {2, 0};
  const Tensor g = explain("gradient", net, x, targets);
  CHECK(max_abs(g) > 0);
  for (const char* method : {"pullback", "soft_pullback", "guided_backprop"})
    check_close(explain(method, net, x, targets), g, 0, 0, method);
  // DeepLift and IG on a linear map: x ⊙ gradient (zero baseline), any quadrature.
  const Tensor ixg = explain("input_x_gradient", net, x, targets);
  check_close(explain("deeplift", net, x, targets), ixg, 1e-5, 1e-7, "deeplift");
  ExplainOptions one_node;
  one_node.ig_rule = "gauss-legendre", one_node.ig_steps = 1;
  check_close(explain("integrated_gradients", net, x, targets, one_node), ixg, 1e-5, 1e-7, "integrated gradients");
  // SmoothGrad of a linear map: the gradient, whatever the noise.
  ExplainOptions noisy;
  noisy.smoothgrad_samples = 4;
  check_close(explain("smoothgrad", net, x, targets, noisy), g, 1e-5, 1e-7, "smoothgrad");
}

TEST_CASE("explain: soft pullback tends to the pullback as the temperatures go to zero") {
  const auto [model, x, targets] = fixture_case("cnn");
  const Tensor hard = explain("pullback", *model, x, targets);
  double previous = 1e30;
  for (float tau : {0.3f, 0.03f, 1e-4f, 1e-7f}) {
    ExplainOptions o;
    o.temperatures = {tau, tau, tau, tau, tau};
    const Tensor soft = explain("soft_pullback", *model, x, targets, o);
    double err = 0;
    for (int64_t i = 0; i < soft.numel(); ++i) err = std::max(err, double(std::fabs(soft.data()[i] - hard.data()[i])));
    CHECK(err < previous);
    previous = err;
  }
  CHECK(previous < 1e-6 * max_abs(hard) + 1e-9);
  // On this ReLU / max-pool / BN-eval network the pullback is the gradient itself.
  check_close(hard, explain("gradient", *model, x, targets), 0, 0, "pullback = gradient");
}

TEST_CASE("explain: pullback ascent with one step is α times the normalised soft pullback") {
  const auto [model, x, targets] = fixture_case("vit");
  ExplainOptions o;
  o.ascent_steps = 1;
  o.ascent_alpha = 0.7f;
  const Tensor sfp = explain("soft_pullback", *model, x, targets, o);
  const int64_t D = x.numel() / 2;
  std::vector<float> want(x.numel());
  for (int64_t n = 0; n < 2; ++n) {
    double norm2 = 0;
    for (int64_t i = n * D; i < (n + 1) * D; ++i) norm2 += double(sfp.data()[i]) * sfp.data()[i];
    for (int64_t i = n * D; i < (n + 1) * D; ++i) want[i] = float(0.7 * sfp.data()[i] / std::sqrt(norm2));
  }
  check_close(explain("pullback_ascent", *model, x, targets, o), Tensor::from_vector(x.shape(), want), 1e-5, 1e-7,
              "PA(K=1)");
  o.ascent_steps = 0;
  CHECK(max_abs(explain("pullback_ascent", *model, x, targets, o)) == 0);
}

TEST_CASE("explain: integrated gradients are complete, Gauss-Legendre converging faster than trapezoid") {
  // The ViT is smooth (GELU): the quadrature error is what is measured.
  const auto [model, x, targets] = fixture_case("vit");
  ExplainOptions o;
  o.baseline = golden("explain", "vit.baseline");
  const std::vector<double> fx = target_logits(*model, x, targets);
  const std::vector<double> f0 = target_logits(*model, broadcast_to(o.baseline, x.shape()).contiguous(), targets);
  auto completeness_error = [&](const std::string& rule, int64_t n) {
    o.ig_rule = rule, o.ig_steps = n;
    const std::vector<double> sums = per_example_sums(explain("integrated_gradients", *model, x, targets, o));
    double err = 0;
    for (size_t i = 0; i < sums.size(); ++i) err = std::max(err, std::fabs(sums[i] - (fx[i] - f0[i])));
    return err;
  };
  // Trapezoid: second order (error ÷4 per doubling). Gauss-Legendre: spectral, down to
  // float32 round-off by 16 nodes.
  const double trap8 = completeness_error("trapezoid", 8), trap16 = completeness_error("trapezoid", 16);
  const double trap64 = completeness_error("trapezoid", 64);
  const double gl8 = completeness_error("gauss-legendre", 8), gl16 = completeness_error("gauss-legendre", 16);
  INFO("IG completeness error: trapezoid n=8 ", trap8, ", 16 ", trap16, ", 64 ", trap64, "; Gauss-Legendre n=8 ",
          gl8, ", 16 ", gl16);
  CHECK(trap8 / trap16 == doctest::Approx(4.0).epsilon(0.25));
  CHECK(gl8 < trap8 / 10);
  CHECK(gl16 < trap64 / 10);
  CHECK(gl16 < 1e-5);
}

TEST_CASE("explain: DeepLift sums to the difference of the target logits on a ReLU network") {
  // ReLU, conv, BN in eval, residual adds, average pool, linear: the rescale rule is exact.
  ModelConfig c;
  c.arch = "resnet18", c.width = 0.0625, c.small_stem = true, c.in_channels = 3, c.image_size = 8, c.num_classes = 4;
  Generator gen(21);
  auto model = make_model(c, gen);
  model->train(false);
  const Tensor x = random_tensor({3, 3, 8, 8}, 9);
  const std::vector<int64_t> targets = {0, 3, 1};
  for (const bool zero : {true, false}) {
    ExplainOptions o;
    if (!zero) o.baseline = random_tensor({3, 3, 8, 8}, 10, -0.5f, 0.5f);
    const Tensor x0 = zero ? Tensor::zeros(x.shape()) : o.baseline;
    const std::vector<double> fx = target_logits(*model, x, targets), f0 = target_logits(*model, x0, targets);
    const std::vector<double> sums = per_example_sums(explain("deeplift", *model, x, targets, o));
    for (size_t i = 0; i < sums.size(); ++i) {
      INFO("example ", i, zero ? " zero baseline" : " random baseline");
      CHECK(std::fabs(fx[i] - f0[i]) > 1e-3);
      CHECK(sums[i] == doctest::Approx(fx[i] - f0[i]).epsilon(1e-4).scale(std::fabs(fx[i] - f0[i])));
    }
  }
}

TEST_CASE("explain: SmoothGrad is the mean gradient at noisy copies, however it is batched") {
  const auto [model, x, targets] = fixture_case("cnn");
  ExplainOptions o;
  o.smoothgrad_samples = 5;
  o.seed = 99;
  o.range = {0.0f, 2.0f};  // σ = 0.15 · 2
  // The definition: sample s's noise is the s-th draw of x's shape from Generator(seed).
  Generator gen(o.seed);
  Tensor want = Tensor::zeros(x.shape());
  for (int s = 0; s < 5; ++s) {
    const Tensor noisy = x + normal_noise(x.shape(), 0.0f, 0.3f, gen);
    const Tensor g = explain("gradient", *model, noisy, targets);
    for (int64_t i = 0; i < g.numel(); ++i) want.data()[i] += g.data()[i] / 5.0f;
  }
  const Tensor batched = explain("smoothgrad", *model, x, targets, o);
  check_attribution(batched, want, 1e-5, "smoothgrad");
  o.max_batch = 1;  // one sample per pass
  check_attribution(explain("smoothgrad", *model, x, targets, o), batched, 1e-5, "smoothgrad, one sample per pass");
  o.max_batch = 64;
  o.max_sample_pass_elements = 2 * x.numel();  // two samples per pass by their elements, the last pass one
  check_attribution(explain("smoothgrad", *model, x, targets, o), batched, 1e-5, "smoothgrad, two samples per pass");
  o.max_sample_pass_elements = 1;  // below one sample: still one sample per pass
  check_attribution(explain("smoothgrad", *model, x, targets, o), batched, 1e-5, "smoothgrad, a budget below one sample");
  CHECK(max_abs(batched - explain("gradient", *model, x, targets)) > 1e-4 * max_abs(batched));
  // Integrated gradients' path points are grouped the same way.
  ExplainOptions path;
  path.ig_steps = 5;
  const Tensor whole = explain("integrated_gradients", *model, x, targets, path);
  path.max_sample_pass_elements = 2 * x.numel();
  check_attribution(explain("integrated_gradients", *model, x, targets, path), whole, 1e-5, "IG, two points per pass");
  path.max_sample_pass_elements = 0;
  CHECK_THROWS_WITH_AS(explain("integrated_gradients", *model, x, targets, path),
                       doctest::Contains("max_sample_pass_elements must be positive, got 0"), Error);
  // At ImageNet's size the samples' passes hold the rows of a single method's, no more: a
  // SmoothGrad's peak memory is one gradient pass's.
  const Tensor images = Tensor::zeros({64, 3, 224, 224});
  CHECK(rows_per_pass(ExplainOptions{}, images) == 8);
  CHECK(sample_rows_per_pass(ExplainOptions{}, images) == 8);
}

TEST_CASE("explain: Grad-CAM's default blocks, token grid and bilinear resize") {
  Generator gen(1);
  ModelConfig r;
  r.arch = "resnet18", r.width = 0.0625;
  CHECK(default_gradcam_block(*make_model(r, gen), {2, 3, 32, 32}) == "layer4.1");  // 4×4 there
  ModelConfig v;
  v.arch = "vgg11_bn", v.width = 0.0625, v.in_channels = 1;
  auto vgg = make_model(v, gen);
  CHECK(default_gradcam_block(*vgg, {2, 1, 32, 32}) == "features.25");  // 2×2 there
  // On 28×28 the last stage is 1×1: the default is the last block with a larger map.
  const std::string small = default_gradcam_block(*vgg, {2, 1, 28, 28});
  {
    NoGrad no_grad;
    vgg->train(false);
    const size_t b = vgg->block_index(small);
    const Tensor at = vgg->features(Tensor::zeros({1, 1, 28, 28}), b);
    CHECK(at.size(2) * at.size(3) > 1);
    for (size_t i = b + 1; i + 1 < vgg->num_blocks(); ++i) {
      const Tensor later = vgg->features(Tensor::zeros({1, 1, 28, 28}), i);
      CHECK(later.size(2) * later.size(3) == 1);
    }
  }
  // An explainer finds the default block once per image shape: one explainer called on
  // 32×32 and then 28×28 images must use each shape's own block.
  {
    vgg->train(false);
    const Explainer cam = make_explainer("gradcam", *vgg, {});
    for (int64_t side : {32, 28, 32}) {
      CAPTURE(side);
      const Tensor x = random_tensor({2, 1, side, side}, 7);
      ExplainOptions at_default;
      at_default.gradcam_block = default_gradcam_block(*vgg, x.shape());
      const Tensor want = explain("gradcam", *vgg, x, {0, 1}, at_default);
      CHECK(max_abs(cam(x, {0, 1}) - want) == 0.0);
      CHECK(max_abs(want) > 0);
    }
  }
  auto vit = fixture_model("vit");
  CHECK(default_gradcam_block(*vit, golden("explain", "vit.x").shape()) == "blocks.0");
  CHECK(default_gradcam_block(*fixture_model("cnn"), golden("explain", "cnn.x").shape()) == "conv3");
  // The maps before upsampling, against the reference's (2×2 token grid; 3×3 channel maps).
  for (const auto& [name, block] : {std::pair<std::string, std::string>{"vit", "blocks.0"}, {"cnn", "conv3"}}) {
    auto model = fixture_model(name);
    const Tensor map = gradcam_map(*model, golden("explain", name + ".x"), fixture_targets(name), block);
    check_attribution(map, golden("explain", name + ".gradcam0_map"), 1e-4, name + " Grad-CAM map");
    CHECK(max_abs(map) > 0);
  }
  // After the last ViT block only the class token has a gradient: the map is zero.
  CHECK(max_abs(golden("explain", "vit.gradcam1")) == 0);
  const Tensor maps = golden("explain", "resize.in");
  check_close(bilinear_resize(maps, 7, 11), golden("explain", "resize.up"), 1e-5, 1e-6, "resize up");
  check_close(bilinear_resize(maps, 2, 3), golden("explain", "resize.down"), 1e-5, 1e-6, "resize down");
  check_close(bilinear_resize(maps, 3, 5), maps, 0, 0, "resize to the same size");
}

TEST_CASE("explain: quadrature rules") {
  for (int n : {1, 2, 5, 12}) {
    const Quadrature q = quadrature("gauss-legendre", n);
    check_close(Tensor::from_vector({n}, std::vector<float>(q.nodes.begin(), q.nodes.end())),
                golden("explain", cat("gl", n, ".nodes")), 1e-6, 1e-7, cat("Gauss-Legendre nodes, n = ", n));
    check_close(Tensor::from_vector({n}, std::vector<float>(q.weights.begin(), q.weights.end())),
                golden("explain", cat("gl", n, ".weights")), 1e-6, 1e-7, cat("Gauss-Legendre weights, n = ", n));
    // Exact for polynomials of degree 2n − 1: ∫₀¹ t^k dt = 1/(k + 1).
    for (int k = 0; k <= 2 * n - 1; ++k) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += q.weights[i] * std::pow(q.nodes[i], k);
      CHECK(s == doctest::Approx(1.0 / (k + 1)).epsilon(1e-12));
    }
  }
  const Quadrature t = quadrature("trapezoid", 5);
  CHECK(t.nodes == std::vector<double>{0, 0.25, 0.5, 0.75, 1});
  CHECK(t.weights == std::vector<double>{0.125, 0.25, 0.25, 0.25, 0.125});
  CHECK_THROWS_WITH_AS(quadrature("trapezoid", 1), doctest::Contains("at least 2 points"), Error);
}
