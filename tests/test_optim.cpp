// Optimizers and learning-rate schedules (engine/optim.h): steps worked out by hand, and
// several steps against torch.optim (tests/goldens/gen_optim.py), for SGD with momentum,
// Nesterov and weight decay, AdamW with decoupled decay and bias correction, and every
// schedule with and without warm-up.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/optim.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

constexpr int kGoldenSteps = 4;  // STEPS in gen_optim.py

// A one-element parameter holding `value`, as an optimizer sees it.
Tensor scalar_parameter(float value) {
  Tensor p = Tensor::from_vector({1}, {value});
  p.requires_grad_();
  return p;
}

// Gives `p` the gradient `g` and lets `opt` take one step.
void step_with(Optimizer& opt, Tensor& p, float g) {
  p.set_grad(Tensor::from_vector({1}, {g}));
  opt.step();
}

double hyper(const std::string& name, const char* field) { return golden("optim", name + "." + field).item(); }

// Replays the fixture's gradients of `name` through `opt` (which holds `p`, started at
// "<name>.param0") and compares the parameter after every step with torch's.
void check_golden_steps(const std::string& name, Optimizer& opt, Tensor& p) {
  for (int k = 1; k <= kGoldenSteps; ++k) {
    p.set_grad(golden("optim", name + ".grad" + std::to_string(k)));
    opt.step();
    check_close(p, golden("optim", name + ".param" + std::to_string(k)), 1e-5, 1e-6,
                name + " after step " + std::to_string(k));
  }
}

Tensor golden_parameter(const std::string& name) {
  Tensor p = golden("optim", name + ".param0").clone();
  p.requires_grad_();
  return p;
}

}  // namespace

TEST_CASE("optim: SGD with momentum and weight decay, two steps by hand") {
  // w0 = 1, gradients 0.5 then −1, lr 0.1, momentum 0.9, weight decay 0.1.
  // Step 1: d = 0.5 + 0.1·1 = 0.6; the first buffer is d itself: v = 0.6; w = 1 − 0.1·0.6 = 0.94.
  // Step 2: d = −1 + 0.1·0.94 = −0.906; v = 0.9·0.6 − 0.906 = −0.366; w = 0.94 + 0.0366 = 0.9766.
  Tensor p = scalar_parameter(1.0f);
  Sgd opt({{"w", p}}, SgdOptions{0.1, 0.9, 0.1, false});
  step_with(opt, p, 0.5f);
  CHECK(p.item() == doctest::Approx(0.94).epsilon(1e-6));
  step_with(opt, p, -1.0f);
  CHECK(p.item() == doctest::Approx(0.9766).epsilon(1e-6));
  CHECK(opt.state().at("momentum.w").item() == doctest::Approx(-0.366).epsilon(1e-6));
}

TEST_CASE("optim: SGD with Nesterov momentum, two steps by hand") {
  // As above, but the step is d + momentum·v.
  // Step 1: d = 0.6, v = 0.6, step 0.6 + 0.54 = 1.14: w = 1 − 0.114 = 0.886.
  // Step 2: d = −1 + 0.0886 = −0.9114; v = 0.54 − 0.9114 = −0.3714;
  //         step −0.9114 + 0.9·(−0.3714) = −1.24566: w = 0.886 + 0.124566 = 1.010566.
  Tensor p = scalar_parameter(1.0f);
  Sgd opt({{"w", p}}, SgdOptions{0.1, 0.9, 0.1, true});
  step_with(opt, p, 0.5f);
  CHECK(p.item() == doctest::Approx(0.886).epsilon(1e-6));
  step_with(opt, p, -1.0f);
  CHECK(p.item() == doctest::Approx(1.010566).epsilon(1e-6));
}

TEST_CASE("optim: plain SGD with weight decay and no momentum keeps no state") {
  // d = 0.5 + 0.1·2 = 0.7: w = 2 − 0.1·0.7 = 1.93.
  Tensor p = scalar_parameter(2.0f);
  Sgd opt({{"w", p}}, SgdOptions{0.1, 0.0, 0.1, false});
  step_with(opt, p, 0.5f);
  CHECK(p.item() == doctest::Approx(1.93).epsilon(1e-6));
  CHECK(opt.state().empty());
}

TEST_CASE("optim: AdamW with decoupled decay and bias correction, two steps by hand") {
  // w0 = 1, gradients 0.5 then −1, lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1.
  // Step 1: w ← w·(1 − 0.1·0.1) = 0.99; m = 0.05, v = 0.001·0.25 = 0.00025;
  //         m̂ = m / (1 − 0.9) = 0.5, v̂ = v / (1 − 0.999) = 0.25:
  //         w = 0.99 − 0.1·0.5 / (√0.25 + 1e-8) = 0.89 (to 2e-9).
  // Step 2: w ← 0.89·0.99 = 0.8811; m = 0.045 − 0.1 = −0.055; v = 0.999·0.00025 + 0.001 = 0.00124975;
  //         m̂ = −0.055 / 0.19, v̂ = 0.00124975 / 0.001999:  w = 0.8811 + 0.1·(0.055/0.19) / √v̂ ≈ 0.917710.
  Tensor p = scalar_parameter(1.0f);
  AdamW opt({{"w", p}}, AdamWOptions{0.1, 0.9, 0.999, 1e-8, 0.1});
  step_with(opt, p, 0.5f);
  CHECK(p.item() == doctest::Approx(0.89).epsilon(1e-6));
  step_with(opt, p, -1.0f);
  const double expected = 0.8811 + 0.1 * (0.055 / 0.19) / std::sqrt(0.00124975 / 0.001999);
  CHECK(expected == doctest::Approx(0.917710).epsilon(1e-5));  // the arithmetic of the comment
  CHECK(p.item() == doctest::Approx(expected).epsilon(1e-6));
  const auto state = opt.state();
  CHECK(state.at("exp_avg.w").item() == doctest::Approx(-0.055).epsilon(1e-6));
  CHECK(state.at("exp_avg_sq.w").item() == doctest::Approx(0.00124975).epsilon(1e-6));
  CHECK(state.at("step").item() == 2.0f);
}

TEST_CASE("optim: SGD against torch.optim.SGD, four steps") {
  for (const char* which : {"plain", "momentum", "decay", "momentum_decay", "nesterov"}) {
    const std::string name = std::string("sgd.") + which;
    Tensor p = golden_parameter(name);
    Sgd opt({{"w", p}}, SgdOptions{hyper(name, "lr"), hyper(name, "momentum"), hyper(name, "weight_decay"),
                                   hyper(name, "nesterov") != 0});
    check_golden_steps(name, opt, p);
  }
}

TEST_CASE("optim: AdamW against torch.optim.AdamW, four steps") {
  for (const char* which : {"plain", "decay", "defaults"}) {
    const std::string name = std::string("adamw.") + which;
    Tensor p = golden_parameter(name);
    AdamW opt({{"w", p}}, AdamWOptions{hyper(name, "lr"), hyper(name, "beta1"), hyper(name, "beta2"),
                                       hyper(name, "eps"), hyper(name, "weight_decay")});
    check_golden_steps(name, opt, p);
  }
}

TEST_CASE("optim: AdamW resumed from its state continues as torch does") {
  const std::string name = "adamw.decay";
  const AdamWOptions options{hyper(name, "lr"), hyper(name, "beta1"), hyper(name, "beta2"), hyper(name, "eps"),
                             hyper(name, "weight_decay")};
  Tensor p = golden_parameter(name);
  AdamW first({{"w", p}}, options);
  for (int k = 1; k <= 2; ++k) {
    p.set_grad(golden("optim", name + ".grad" + std::to_string(k)));
    first.step();
  }
  // A fresh optimizer given the state takes steps 3 and 4 as the uninterrupted one would.
  AdamW resumed({{"w", p}}, options);
  resumed.set_state(first.state());
  for (int k = 3; k <= 4; ++k) {
    p.set_grad(golden("optim", name + ".grad" + std::to_string(k)));
    resumed.step();
  }
  check_close(p, golden("optim", name + ".param4"), 1e-5, 1e-6, "resumed AdamW after step 4");
}

namespace {

Schedule golden_schedule(const std::string& name) {
  const std::string key = "schedule." + name;
  Schedule s;
  s.kind = static_cast<Schedule::Kind>(static_cast<int>(hyper(key, "kind")));
  s.base_lr = hyper(key, "base_lr");
  s.warmup = static_cast<int64_t>(hyper(key, "warmup"));
  s.total = static_cast<int64_t>(hyper(key, "total"));
  s.min_factor = hyper(key, "min_factor");
  s.step_every = static_cast<int64_t>(hyper(key, "step_every"));
  s.gamma = hyper(key, "gamma");
  return s;
}

}  // namespace

TEST_CASE("optim: every schedule against torch's LinearLR, CosineAnnealingLR and StepLR at every step") {
  for (const char* name : {"cosine", "cosine_warmup", "cosine_warmup_floor", "step", "step_warmup", "constant",
                           "constant_warmup"}) {
    INFO("schedule ", name);
    const Schedule s = golden_schedule(name);
    const std::vector<float> expected = golden("optim", std::string("schedule.") + name + ".lr").to_vector();
    REQUIRE(int64_t(expected.size()) == s.total);
    for (int64_t step = 0; step < s.total; ++step) {
      INFO("step ", step);
      CHECK(s.at(step) == doctest::Approx(expected[size_t(step)]).epsilon(1e-6));
    }
  }
}

TEST_CASE("optim: schedules at named steps, by hand") {
  Schedule s;
  s.base_lr = 0.5;
  s.warmup = 4;
  s.total = 16;

  SUBCASE("cosine with warm-up") {
    s.kind = Schedule::Cosine;
    CHECK(s.at(0) == doctest::Approx(0.125));  // first: base·1/4
    CHECK(s.at(3) == doctest::Approx(0.5));    // last warm-up step reaches the base
    CHECK(s.at(4) == doctest::Approx(0.5));    // first decay step: cos(0) = 1
    CHECK(s.at(10) == doctest::Approx(0.25));  // middle of the 12 decay steps: cos(π/2) = 0
    CHECK(s.at(15) == doctest::Approx(0.25 * (1 + std::cos(M_PI * 11.0 / 12.0))));  // last
    CHECK(s.at(16) == doctest::Approx(0.0));   // past the end it stays at the floor
    s.min_factor = 0.2;                        // floor 0.1: 0.1 + 0.4·(1 + cos)/2
    CHECK(s.at(10) == doctest::Approx(0.3));
    CHECK(s.at(40) == doctest::Approx(0.1));
  }
  SUBCASE("step decay with warm-up") {
    s.kind = Schedule::Step;
    s.step_every = 5;
    s.gamma = 0.1;
    CHECK(s.at(1) == doctest::Approx(0.25));
    CHECK(s.at(4) == doctest::Approx(0.5));    // steps 4..8: no decay yet
    CHECK(s.at(8) == doctest::Approx(0.5));
    CHECK(s.at(9) == doctest::Approx(0.05));   // 5 steps after the warm-up
    CHECK(s.at(15) == doctest::Approx(0.005));
  }
  SUBCASE("constant with warm-up, and without") {
    s.kind = Schedule::Constant;
    CHECK(s.at(2) == doctest::Approx(0.375));
    CHECK(s.at(4) == doctest::Approx(0.5));
    CHECK(s.at(15) == doctest::Approx(0.5));
    s.warmup = 0;
    CHECK(s.at(0) == doctest::Approx(0.5));
  }
  SUBCASE("cosine without warm-up starts at the base") {
    s.kind = Schedule::Cosine;
    s.warmup = 0;
    CHECK(s.at(0) == doctest::Approx(0.5));
    CHECK(s.at(8) == doctest::Approx(0.25));
  }
}
