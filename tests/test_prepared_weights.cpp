// Versions of a tensor's values and the forms kernels prepare from them (engine/tensor.h
// PreparedForms): every write moves the version, and a form is found at its version only.
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
#include "ops/layout.h"
#include "ops/reduce.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

size_t forms_kept(const Tensor& t) { return t.impl()->storage->prepared().size(); }

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
    w.data()[0] = 1.0f;  // a write: both forms are stale
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
