// Versions of a tensor's values and the forms kernels prepare from them (engine/tensor.h
// PreparedForms, ops/conv/prepared_weights.h): every write moves the version; an eval-mode
// convolution keeps its weights' transforms, packings and BatchNorm fold per version, gives
// the bits it gave without them, and the new answer once the weights change.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>

#include "engine/autograd.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/tensor.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// One layer per forward algorithm of ops/conv.h, and with dead taps cut.
struct Layer {
  Shape x, w;
  Conv2dOptions options;
};
std::vector<Layer> layers() {
  return {
      {{2, 16, 8, 8}, {24, 16, 3, 3}, Conv2dOptions::square(1, 1)},     // Winograd F(2×2)
      {{2, 16, 16, 16}, {24, 16, 3, 3}, Conv2dOptions::square(1, 1)},   // Winograd F(4×4)
      {{2, 8, 41, 41}, {32, 8, 3, 3}, Conv2dOptions::square(2, 1)},     // direct (strided, by channels)
      {{2, 16, 16, 16}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},   // direct by rows, where AVX-512 runs
      {{2, 8, 10, 10}, {12, 8, 1, 1}, Conv2dOptions::square(1, 0)},     // im2col, 1×1 in place
      {{2, 8, 9, 9}, {12, 8, 3, 3}, Conv2dOptions::square(2, 0)},       // im2col
      {{2, 16, 1, 1}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},     // dead taps cut
  };
}

EvalBatchNorm random_batch_norm(int64_t O, uint64_t seed) {
  return {random_tensor({O}, seed), random_tensor({O}, seed + 1), random_tensor({O}, seed + 2),
          random_tensor({O}, seed + 3, 0.2f, 2.0f), 1e-5f};
}

// The fused op's output where nothing was kept: fresh copies of every tensor.
Tensor fresh_output(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o, const EvalBatchNorm& bn) {
  const EvalBatchNorm copy{bn.weight.clone(), bn.bias.clone(), bn.running_mean.clone(), bn.running_var.clone(), bn.eps};
  return conv2d_batch_norm_eval(x.clone(), w.clone(), b.clone(), o, copy, true);
}

}  // namespace

TEST_CASE("tensor version: every write moves it, reads do not") {
  Tensor t = Tensor::zeros({4, 3});
  const Tensor& read = t;
  uint64_t v = t.version();
  const auto moved = [&] {
    const bool m = t.version() != v;
    v = t.version();
    return m;
  };
  // Reads: through a const tensor, at(), to_vector(), clone(), contiguous() and a view.
  (void)read.data();
  (void)t.at({1, 2});
  (void)t.to_vector();
  (void)t.clone();
  (void)t.contiguous();
  (void)transpose(t, 0, 1).contiguous();
  (void)slice(t, 0, 1, 3).to_vector();
  CHECK_FALSE(moved());
  // Writes.
  t.data()[0] = 1.0f;
  CHECK(moved());
  t.fill_(2.0f);
  CHECK(moved());
  t.copy_from(Tensor::ones({4, 3}));
  CHECK(moved());
  Tensor view = slice(t.detach(), 0, 0, 2);  // a view shares the storage, and its version
  view.data()[1] = 5.0f;
  CHECK(moved());
  CHECK(t.at({0, 1}) == 5.0f);
  t.detach().data()[2] = 6.0f;
  CHECK(moved());
}

TEST_CASE("tensor version: optimiser steps and loaders move the parameters' versions") {
  Generator gen(5);
  ModelConfig config;
  config.arch = "resnet18", config.small_stem = true, config.in_channels = 1, config.num_classes = 10;
  auto model = make_model(config, gen);
  const NamedTensors params = model->named_parameters();
  const auto versions = [&] {
    std::map<std::string, uint64_t> out;
    for (const auto& [name, p] : model->state_dict()) out[name] = p.version();
    return out;
  };
  const auto every_parameter_moved = [&](const std::map<std::string, uint64_t>& before) {
    for (const auto& [name, p] : params) {
      CAPTURE(name);
      CHECK(p.version() != before.at(name));
    }
  };
  const auto step_with = [&](Optimizer& optimizer) {
    const Tensor loss = sum(model->forward(random_tensor({2, 1, 16, 16}, 50)));
    backward(loss);
    const auto before = versions();
    optimizer.step();
    every_parameter_moved(before);
    for (const auto& [name, p] : params) Tensor(p).zero_grad();
  };
  Sgd sgd(params, SgdOptions{});
  step_with(sgd);
  AdamW adamw(params, AdamWOptions{});
  step_with(adamw);

  // Loading a state dict, and a checkpoint written to disk, moves every tensor it writes.
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : model->state_dict()) state[name] = t.clone();
  auto before = versions();
  load_state_dict(*model, state, "a state dict");
  for (const auto& [name, t] : model->state_dict()) {
    CAPTURE(name);
    CHECK(t.version() != before.at(name));
  }
  const TempDir dir;
  const std::string path = dir.file("checkpoint.safetensors");
  save_checkpoint(path, *model, nullptr, 0, 0);
  before = versions();
  const Checkpoint checkpoint = load_checkpoint(path);
  load_state_dict(*model, checkpoint.model, path);
  every_parameter_moved(before);
}

TEST_CASE("prepared forms: found by key at their version, bounded, counted in MemoryStats, freed with the storage") {
  const int64_t at_start = memory_stats().current_bytes;
  {
    Tensor w = Tensor::zeros({8});
    const Tensor& read = w;
    int made = 0;
    const auto form = [&](uint64_t kind) {
      return read.prepared<int>({kind}, [&] {
        ++made;
        return std::pair{std::make_shared<const int>(int(kind)), int64_t(1000)};
      });
    };
    CHECK(*form(1) == 1);
    CHECK(*form(1) == 1);
    CHECK(made == 1);
    CHECK(memory_stats().current_bytes == at_start + 32 + 1000);
    CHECK(*form(2) == 2);
    CHECK(made == 2);
    CHECK(forms_kept(w) == 2);
    w.data()[0] = 1.0f;  // a write: both forms are stale, and go at once
    CHECK(forms_kept(w) == 0);
    CHECK(memory_stats().current_bytes == at_start + 32);
    CHECK(*form(1) == 1);
    CHECK(made == 3);
    CHECK(forms_kept(w) == 1);
    CHECK(memory_stats().current_bytes == at_start + 32 + 1000);
    for (uint64_t kind = 10; kind < 20; ++kind) form(kind);
    CHECK(forms_kept(w) == PreparedForms::kMaxForms);
    CHECK(memory_stats().current_bytes == at_start + 32 + int64_t(PreparedForms::kMaxForms) * 1000);
    // Another view of the same storage is another key.
    CHECK(read.prepared<int>({10}, [&] { return std::pair{std::make_shared<const int>(0), int64_t(0)}; }) != nullptr);
    const Tensor half = slice(w.detach(), 0, 0, 4);
    CHECK(*half.prepared<int>({19}, [&] { return std::pair{std::make_shared<const int>(-1), int64_t(0)}; }) == -1);
  }
  CHECK(memory_stats().current_bytes == at_start);
}

TEST_CASE("conv2d_batch_norm_eval: weights prepared once per version, the same bits, the new answer after a write") {
  // Inference (nothing recorded): the convolution's forms of the raw weights are kept.
  uint64_t seed = 7000;
  for (const Layer& c : layers()) {
    INFO("x ", to_string(c.x), " w ", to_string(c.w), " ",
         std::string(to_string(conv2d_algorithm(Tensor::empty(c.x), Tensor::empty(c.w), c.options))));
    const int64_t O = c.w[0];
    const Tensor x = random_tensor(c.x, seed++), b = random_tensor({O}, seed++);
    Tensor w = random_tensor(c.w, seed++);
    const EvalBatchNorm bn = random_batch_norm(O, seed);
    seed += 4;
    NoGrad off;
    const Tensor first = conv2d_batch_norm_eval(x, w, b, c.options, bn, true);
    const bool cut = c.x[2] == 1;
    CHECK(forms_kept(w) == (cut ? 0u : 1u));
    const Tensor second = conv2d_batch_norm_eval(x, w, b, c.options, bn, true);
    CHECK(second.to_vector() == first.to_vector());
    CHECK(first.to_vector() == fresh_output(x, w, b, c.options, bn).to_vector());
    // Written through data(), through copy_from: the next pass reads the new weights.
    float* weights = w.data();
    for (int64_t i = 0; i < w.numel(); ++i) weights[i] = 0.5f - weights[i];
    const Tensor after_write = conv2d_batch_norm_eval(x, w, b, c.options, bn, true);
    CHECK(after_write.to_vector() != first.to_vector());
    CHECK(after_write.to_vector() == fresh_output(x, w, b, c.options, bn).to_vector());
    w.copy_from(random_tensor(c.w, seed++));
    CHECK(conv2d_batch_norm_eval(x, w, b, c.options, bn, true).to_vector() ==
          fresh_output(x, w, b, c.options, bn).to_vector());
  }
}

TEST_CASE("conv2d_batch_norm_eval: one weight tensor at two group counts keeps a form for each") {
  // (8, 4, 1, 1) weights read 4 input channels as one group, 8 as two.
  const Tensor w = random_tensor({8, 4, 1, 1}, 7500), b = random_tensor({8}, 7501);
  const EvalBatchNorm bn = random_batch_norm(8, 7502);
  NoGrad off;
  for (int round = 0; round < 2; ++round)
    for (const int64_t groups : {1, 2}) {
      CAPTURE(groups);
      const Tensor x = random_tensor({2, 4 * groups, 5, 5}, 7510 + uint64_t(groups));
      const Conv2dOptions o = Conv2dOptions::square(1, 0, 1, groups);
      CHECK(conv2d_batch_norm_eval(x, w, b, o, bn, true).to_vector() == fresh_output(x, w, b, o, bn).to_vector());
    }
  CHECK(forms_kept(w) == 2);
}

TEST_CASE("conv2d_batch_norm_eval: recorded, the fold and the input gradient's forms are kept per version") {
  // Parameters in the graph (an explanation of a model whose parameters require grad): the
  // folded weight is kept with the weight, and its convolution forms with it, forward and
  // for the input gradient; every transport gives what fresh tensors give, and the new
  // answer after the weight, γ or the running variance is written.
  uint64_t seed = 8000;
  Temperatures soft_relu;
  soft_relu.relu = 0.5f;
  for (const Layer& c : layers()) {
    INFO("x ", to_string(c.x), " w ", to_string(c.w), " input gradient by ",
         std::string(to_string(conv2d_algorithm(Tensor::empty(c.x), Tensor::empty(c.w), c.options, true))));
    const int64_t O = c.w[0];
    const Tensor x = random_tensor(c.x, seed++), b = random_tensor({O}, seed++);
    Tensor w = random_tensor(c.w, seed++);
    w.requires_grad_();
    EvalBatchNorm bn = random_batch_norm(O, seed);
    seed += 4;
    bn.weight.requires_grad_();
    Tensor u;
    {
      NoGrad off;
      u = random_tensor(conv2d(x, w, b, c.options).shape(), seed++);
    }
    const auto transports = {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(soft_relu)};
    const auto cotangents = [&](const Tensor& weight, const EvalBatchNorm& norm, const Transport& t) {
      const Fn f = [&](const Args& in) { return conv2d_batch_norm_eval(in[0], weight, b, c.options, norm, true); };
      return vjp(f, {x}, u, t)[0].to_vector();
    };
    const auto fresh = [&](const Transport& t) {
      Tensor w_copy = w.detach().clone();
      w_copy.requires_grad_();
      EvalBatchNorm copy{bn.weight.detach().clone(), bn.bias.clone(), bn.running_mean.clone(),
                         bn.running_var.clone(), bn.eps};
      copy.weight.requires_grad_();
      return cotangents(w_copy, copy, t);
    };
    const auto check_against_fresh = [&] {
      for (const Transport& t : transports) {
        const std::vector<float> kept = cotangents(w, bn, t);
        CHECK(kept == cotangents(w, bn, t));
        CHECK(kept == fresh(t));
      }
    };
    check_against_fresh();
    CHECK(forms_kept(w) == 1);  // the fold, made before dead taps are cut
    const std::vector<float> before = cotangents(w, bn, Transport::gradient());
    float* weights = w.data();
    for (int64_t i = 0; i < w.numel(); ++i) weights[i] = 0.5f - weights[i];
    check_against_fresh();
    CHECK(cotangents(w, bn, Transport::gradient()) != before);
    bn.weight.data()[0] *= -2.0f;
    check_against_fresh();
    bn.running_var.data()[O - 1] += 1.5f;
    check_against_fresh();
  }
}

TEST_CASE("prepared weights: an eval-mode model whose weights change after a pass gives the new answer") {
  // A ResNet in eval mode: a pass, an optimiser step, another pass, against a fresh model
  // with the stepped weights loaded; the same after loading other weights; and the same
  // for an explanation's input gradient.
  ModelConfig config;
  config.arch = "resnet18", config.small_stem = true, config.in_channels = 1, config.num_classes = 10;
  const Tensor x = random_tensor({2, 1, 16, 16}, 60);
  auto model = check_kept_forms_follow_writes(config, 11, x, "conv", true);

  // The input gradient of an explanation, parameters requiring grad, before and after a write.
  const auto input_gradient = [&](Model& m) {
    Tensor input = x.clone();
    input.requires_grad_();
    return grad(sum(m.forward(input)), {input})[0].to_vector();
  };
  const std::vector<float> explained = input_gradient(*model);
  CHECK(input_gradient(*model) == explained);
  for (const auto& [name, p] : model->named_parameters())
    if (name.find("conv") != std::string::npos) Tensor(p).data()[0] += 0.25f;
  Generator other_gen(13);
  auto fresh = make_model(config, other_gen);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : model->state_dict()) state[name] = t.clone();
  load_state_dict(*fresh, state, "the written weights");
  fresh->train(false);
  const std::vector<float> after = input_gradient(*model);
  CHECK(after != explained);
  CHECK(after == input_gradient(*fresh));
}

namespace {

// Sets the prepared forms' budget for a scope, and puts the one before back.
struct BudgetScope {
  int64_t before = prepared_forms_budget();
  explicit BudgetScope(int64_t bytes) { set_prepared_forms_budget(bytes); }
  ~BudgetScope() { set_prepared_forms_budget(before); }
};

}  // namespace

TEST_CASE("prepared forms: past the byte budget the least recently used forms of any storage go") {
  const BudgetScope budget(2500);
  const MemoryStats at_start = memory_stats();
  REQUIRE(at_start.prepared_bytes == 0);  // nothing kept from earlier cases
  const Tensor a = Tensor::zeros({4}), b = Tensor::zeros({4}), c = Tensor::zeros({4});
  std::map<std::string, int> made;
  const auto form = [&](const Tensor& t, const std::string& name) {
    return *t.prepared<int>({1}, [&] {
      ++made[name];
      return std::pair{std::make_shared<const int>(int(name[0])), int64_t(1000)};
    });
  };
  CHECK(form(a, "a") == 'a');
  CHECK(form(b, "b") == 'b');
  CHECK(memory_stats().prepared_bytes == 2000);
  CHECK(form(a, "a") == 'a');  // a used after b: b is now the least recently used
  CHECK(made["a"] == 1);
  CHECK(form(c, "c") == 'c');  // 3000 bytes past a budget of 2500: b goes
  CHECK(forms_kept(a) == 1);
  CHECK(forms_kept(b) == 0);
  CHECK(forms_kept(c) == 1);
  CHECK(memory_stats().prepared_evictions == at_start.prepared_evictions + 1);
  CHECK(memory_stats().prepared_bytes == 2000);
  CHECK(memory_stats().current_bytes == at_start.current_bytes + 3 * 16 + 2000);
  CHECK(form(b, "b") == 'b');  // made again, the same value; now a is the oldest
  CHECK(made["b"] == 2);
  CHECK(forms_kept(a) == 0);
  CHECK(memory_stats().prepared_evictions == at_start.prepared_evictions + 2);
  {
    const BudgetScope none(0);  // a form is handed out, then dropped at once
    CHECK(form(a, "a") == 'a');
    CHECK(forms_kept(a) + forms_kept(b) + forms_kept(c) == 0);
    CHECK(memory_stats().prepared_bytes == 0);
  }
  {
    const BudgetScope unlimited(-1);
    for (const Tensor* t : {&a, &b, &c}) form(*t, "x");
    CHECK(forms_kept(a) + forms_kept(b) + forms_kept(c) == 3);
    CHECK(memory_stats().prepared_evictions == at_start.prepared_evictions + 5);
  }
}

TEST_CASE("prepared forms: a model gives the same bits under a tiny budget as under none") {
  // A ResNet in eval mode, inference and an explanation's input gradient: with nothing
  // dropped, with every form dropped as soon as it is made, and with a budget that drops some
  // of them between layers.
  Generator gen(21);
  ModelConfig config;
  config.arch = "resnet18", config.small_stem = true, config.in_channels = 3, config.num_classes = 10;
  auto model = make_model(config, gen);
  model->train(false);
  const Tensor x = random_tensor({2, 3, 16, 16}, 70);
  const auto outputs = [&] {
    std::vector<float> out;
    for (int pass = 0; pass < 2; ++pass) {
      {
        NoGrad off;
        const std::vector<float> y = model->forward(x).to_vector();
        out.insert(out.end(), y.begin(), y.end());
      }
      Tensor input = x.clone();
      input.requires_grad_();
      const std::vector<float> g = grad(sum(model->forward(input)), {input})[0].to_vector();
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  std::vector<float> unlimited;
  int64_t kept_bytes = 0;
  {
    const BudgetScope budget(-1);
    unlimited = outputs();
    kept_bytes = memory_stats().prepared_bytes;
  }
  CHECK(kept_bytes > 0);
  for (const int64_t bytes : {int64_t(0), int64_t(1), kept_bytes / 3}) {
    CAPTURE(bytes);
    const BudgetScope budget(bytes);
    const int64_t evictions = memory_stats().prepared_evictions;
    CHECK(outputs() == unlimited);
    CHECK(memory_stats().prepared_evictions > evictions);
    CHECK(memory_stats().prepared_bytes <= bytes);
  }
}
