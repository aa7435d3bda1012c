// PGD attacks, PGD adversarial training and rAuA (analysis/common/robustness.h): the attack stays
// in its ε-set and in [0, 1] and raises the loss; its L∞ and L2 steps match PyTorch on the
// tiny stitching model; an adversarial step is a classification step on the attacked
// batch; adversarial runs resume bit for bit; AuA is the trapezoid; bad options are one line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "analysis/common/robustness.h"
#include "analysis/stitching/protocol.h"
#include "analysis/stitching/train.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/random.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "tests/stitch_fixture.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

RawClassifier classifier_of(const Endpoint& e) {
  return [&e](const Tensor& raw) { return e.model->forward(e.input(raw)); };
}

// The labels the model gives `raw` (so that every example starts correctly classified).
std::vector<int64_t> predicted(const RawClassifier& logits, const Tensor& raw) {
  NoGrad off;
  const Tensor l = logits(raw).contiguous();
  std::vector<int64_t> out;
  for (int64_t n = 0; n < l.size(0); ++n) {
    const float* row = l.data() + n * l.size(1);
    out.push_back(std::max_element(row, row + l.size(1)) - row);
  }
  return out;
}

std::vector<float> per_example_loss(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels) {
  NoGrad off;
  return per_example_cross_entropy(logits(raw), labels).to_vector();
}

// 32 images of 1×16×16 in [0, 1] whose label is the brighter half (top or bottom) plus
// the quadrant column: 4 classes, learnable by the tiny VGG in a few steps.
std::shared_ptr<Dataset> make_halves(uint64_t seed) {
  Generator gen(seed);
  std::vector<float> pixels = uniform({32, 1, 16, 16}, 0.0f, 0.5f, gen).to_vector();
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 32; ++i) {
    for (int64_t p = 0; p < 256; ++p)
      if ((p / 128) == (i % 4) / 2 && (p % 16) / 8 == (i % 2)) pixels[size_t(i * 256 + p)] += 0.5f;
    labels.push_back(i % 4);
  }
  return std::make_shared<InMemoryDataset>("halves", Shape{1, 16, 16}, std::move(pixels), std::move(labels), 10);
}

DataSource halves() {
  DataSource d;
  d.spec = "halves";
  d.train = make_halves(1);
  d.test = make_halves(2);
  d.mean = {0.5f};
  d.std = {0.25f};
  d.images = true;
  return d;
}

// Lines of a command's output that report an error.
int64_t error_lines(const std::string& output) {
  int64_t lines = 0;
  for (size_t at = output.find("error:"); at != std::string::npos; at = output.find("error:", at + 1)) ++lines;
  return lines;
}

// AdamW at 1e-2 on halves() in batches of 8 (4 steps an epoch), without augmentation.
TrainOptions small_run(int64_t epochs) {
  TrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.epochs = epochs;
  o.batch_size = 8;
  o.augment = false;
  return o;
}

// The first `n` test images of halves(), raw.
Tensor halves_test_images(const DataSource& data, int64_t n) {
  Tensor out = Tensor::empty({n, 1, 16, 16});
  for (int64_t i = 0; i < n; ++i) data.test->get(i, out.data() + i * 256);
  return out;
}

std::vector<float> all_weights(const Model& m) {
  std::vector<float> out;
  for (auto& [name, t] : m.state_dict()) {
    const std::vector<float> v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Every parameter of `got` has a gradient, bit for bit the one of the same parameter of `want`.
void check_same_gradients(const Model& got_model, const Model& want_model) {
  const auto got = got_model.named_parameters(), want = want_model.named_parameters();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].second.grad().defined());
    CHECK_MESSAGE(got[i].second.grad().to_vector() == want[i].second.grad().to_vector(), got[i].first);
  }
}

// `batch` with its inputs replaced by raw pixels seen through the endpoint's normalisation.
Batch with_raw_inputs(const Batch& batch, const Endpoint& view, const Tensor& raw) {
  Batch out = batch;
  NoGrad off;
  out.inputs = view.input(raw).contiguous();
  return out;
}

}  // namespace

TEST_CASE("PGD: the adversarial example stays in its ε-set and in [0, 1], and raises every example's loss") {
  const Endpoint b = stitch_fixture_model("B");
  const RawClassifier logits = classifier_of(b);
  // Pixels at 0 and 1 included, where the clamp and the ε-set meet.
  Tensor x = random_tensor({6, 1, 16, 16}, 3, 0.0f, 1.0f);
  for (int64_t i = 0; i < 40; ++i) x.data()[i] = 0.0f, x.data()[x.numel() - 1 - i] = 1.0f;
  const std::vector<int64_t> labels = predicted(logits, x);
  const std::vector<float> clean_loss = per_example_loss(logits, x, labels);
  for (const std::string norm : {"linf", "l2"}) {
    for (const bool random_start : {false, true}) {
      INFO(norm, random_start ? " from a random start" : " from x");
      PgdOptions o;
      o.norm = norm;
      o.eps = norm == "linf" ? 0.03f : 0.5f;
      o.steps = 6;
      o.step_size = o.eps;  // large steps: every one leaves the set and is projected back
      o.random_start = random_start;
      const Tensor adversarial = pgd_attack(logits, x, labels, o);
      const float *pa = adversarial.data(), *px = x.data();
      for (int64_t n = 0; n < 6; ++n) {
        double norm2 = 0, largest = 0;
        for (int64_t i = n * 256; i < (n + 1) * 256; ++i) {
          CHECK((pa[i] >= 0.0f && pa[i] <= 1.0f));
          norm2 += double(pa[i] - px[i]) * (pa[i] - px[i]);
          largest = std::max(largest, double(std::abs(pa[i] - px[i])));
        }
        if (norm == "linf") {
          CHECK(largest <= o.eps * (1 + 1e-5));
          CHECK(largest >= o.eps * (1 - 1e-5));  // sign steps reach the box's faces
        } else {
          CHECK(std::sqrt(norm2) <= o.eps * (1 + 1e-5));
          CHECK(std::sqrt(norm2) > 0.5 * o.eps);
        }
      }
      const std::vector<float> attacked_loss = per_example_loss(logits, adversarial, labels);
      for (size_t n = 0; n < labels.size(); ++n) CHECK(attacked_loss[n] > clean_loss[n]);
    }
  }
  PgdOptions none;
  none.eps = 0.0f;
  CHECK(pgd_attack(logits, x, labels, none).to_vector() == x.to_vector());  // ε = 0: the clean image
}

TEST_CASE("PGD: L∞ sign steps and L2 normalised steps match PyTorch on the tiny VGG") {
  const Endpoint b = stitch_fixture_model("B");
  const Tensor x = golden("pgd", "x");
  std::vector<int64_t> labels;
  for (float v : golden("pgd", "labels").to_vector()) labels.push_back(int64_t(v));
  check_close(per_example_cross_entropy(classifier_of(b)(x), labels), golden("pgd", "clean_loss"), 1e-5, 1e-5,
              "clean per-example cross-entropy");
  for (const std::string norm : {"linf", "l2"}) {
    INFO(norm);
    PgdOptions o;
    o.norm = norm;
    o.eps = golden("pgd", norm + ".eps").to_vector()[0];
    o.steps = 3;  // gen_pgd.py STEPS; step 2.5·ε/steps, the default
    const Tensor adversarial = pgd_attack(classifier_of(b), x, labels, o);
    const Tensor expected = golden("pgd", norm + ".adversarial");
    if (norm == "linf") {
      // Pixels whose gradient was ever tiny may take the other sign; gen_pgd.py marks them.
      const std::vector<float> undecided = golden("pgd", "linf.undecided").to_vector();
      const std::vector<float> got = adversarial.to_vector(), want = expected.to_vector();
      int64_t compared = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (undecided[i] == 0.0f) {
          CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-6, "pixel ", i);
          ++compared;
        }
      CHECK(compared >= int64_t(got.size()) - 4);
    } else {
      check_close(adversarial, expected, 1e-5, 1e-5, "L2 PGD");
    }
    check_close(per_example_cross_entropy(classifier_of(b)(adversarial), labels), golden("pgd", norm + ".loss"), 1e-4,
                1e-4, norm + " attacked loss");
  }
}

TEST_CASE("PGD training: one step is a classification step on the batch attacked in eval mode") {
  const DataSource data = halves();
  TrainOptions o;
  o.batch_size = 8;
  PgdOptions pgd;
  pgd.eps = 0.05f;
  pgd.steps = 2;
  Loader loader(data.train, LoaderOptions{8, true, true, false, 3, data.train_transforms(false)});
  const Batch batch = loader.next();
  Generator g1(7), g2(7);
  auto adversarial_model = make_model(tiny_vgg_config(), g1), reference = make_model(tiny_vgg_config(), g2);
  adversarial_model->train(true);

  const TrainingStep step = adversarial_training_step(o, pgd, data.mean, data.std);
  CHECK(step.metadata.at("train.adversarial") == "pgd");
  CHECK(step.metadata.at("train.pgd-eps") == "0.05");
  CHECK(step.metadata.at("train.pgd-step-size") == "0.0625");
  const StepOutcome adversarial = step.run(*adversarial_model, batch, 0);
  CHECK(adversarial_model->training());  // back in train mode for the optimizer's step

  // By hand: the attack on the raw pixels with the model in eval mode, then the
  // classification step on the normalised attacked batch in train mode.
  const Endpoint view{"reference", reference, data.mean, data.std};
  reference->train(false);
  const Tensor attacked_raw = pgd_attack(classifier_of(view), raw_pixels(batch.inputs, view.mean, view.std, view.name), batch.labels, pgd);
  reference->train(true);
  const Batch attacked = with_raw_inputs(batch, view, attacked_raw);
  CHECK(max_abs(attacked.inputs - batch.inputs) > 0.05f);  // the attack moved the batch
  const StepOutcome expected = classification_step(*reference, attacked, 0.0f, 1, 0);
  CHECK(adversarial.loss_sum == expected.loss_sum);
  CHECK(adversarial.correct == expected.correct);
  check_same_gradients(*adversarial_model, *reference);
  // BatchNorm's running statistics moved once, by the training forward pass only.
  CHECK(all_weights(*adversarial_model) == all_weights(*reference));
  // The attacked batch is harder than the clean one.
  const StepOutcome clean = classification_step(*reference, batch, 0.0f, 1, 0);
  CHECK(adversarial.loss_sum > clean.loss_sum);
}

TEST_CASE("PGD: with keyed random starts an example's attack is its own: alone, in a batch or reordered, the same") {
  const Tensor weight = random_tensor({256, 10}, 9, -1.0f, 1.0f);
  // Each row through the classifier alone, so that no kernel sees rows together: a row's
  // attack can then depend on nothing but its own start.
  const RawClassifier row_by_row = [&](const Tensor& raw) {
    std::vector<Tensor> rows;
    for (int64_t n = 0; n < raw.size(0); ++n) rows.push_back(matmul(reshape(slice(raw, 0, n, n + 1), {1, 256}), weight));
    return concat(rows, 0);
  };
  const Tensor x = random_tensor({6, 1, 16, 16}, 8, 0.0f, 1.0f);
  const std::vector<int64_t> labels = predicted(row_by_row, x);
  const std::vector<int64_t> samples = {40, 3, 17, 9, 25, 31};  // the examples' dataset indices
  const auto row = [](const Tensor& t, int64_t n) { return slice(t, 0, n, n + 1).contiguous().to_vector(); };
  PgdOptions o;
  o.eps = 0.1f;
  o.steps = 3;
  o.random_start = true;
  o.seed = 4;
  for (const char* norm : {"linf", "l2"}) {
    CAPTURE(norm);
    o.norm = norm;
    const Tensor whole = pgd_attack_keyed(row_by_row, x, labels, o, 7, samples);
    // Alone (as on a rank whose shard holds it) and in reverse order: the same rows.
    const std::vector<int64_t> reversed_order = {5, 4, 3, 2, 1, 0};
    std::vector<Tensor> reversed_rows;
    std::vector<int64_t> reversed_labels, reversed_samples;
    for (int64_t n : reversed_order) {
      reversed_rows.push_back(slice(x, 0, n, n + 1));
      reversed_labels.push_back(labels[size_t(n)]);
      reversed_samples.push_back(samples[size_t(n)]);
    }
    const Tensor reversed =
        pgd_attack_keyed(row_by_row, concat(reversed_rows, 0).contiguous(), reversed_labels, o, 7, reversed_samples);
    for (int64_t n = 0; n < 6; ++n) {
      CAPTURE(n);
      const Tensor alone = pgd_attack_keyed(row_by_row, slice(x, 0, n, n + 1).contiguous(), {labels[size_t(n)]}, o, 7,
                                            {samples[size_t(n)]});
      CHECK(alone.to_vector() == row(whole, n));
      CHECK(row(reversed, 5 - n) == row(whole, n));
    }
    // The start is random and keyed: another draw, or another sample at the same place,
    // starts elsewhere; so does the clean start, and one generator drawn over the batch.
    CHECK(pgd_attack_keyed(row_by_row, x, labels, o, 8, samples).to_vector() != whole.to_vector());
    std::vector<int64_t> other_samples = samples;
    other_samples[0] = 41;
    const Tensor other = pgd_attack_keyed(row_by_row, x, labels, o, 7, other_samples);
    CHECK(row(other, 0) != row(whole, 0));
    CHECK(row(other, 1) == row(whole, 1));
    PgdOptions clean_start = o;
    clean_start.random_start = false;
    CHECK(pgd_attack_keyed(row_by_row, x, labels, clean_start, 7, samples).to_vector() != whole.to_vector());
    CHECK(pgd_attack(row_by_row, x, labels, o).to_vector() != whole.to_vector());
    CHECK_THROWS_WITH(pgd_attack_keyed(row_by_row, x, labels, o, 7, {1, 2}),
                      doctest::Contains("2 random-start keys for 6 examples"));
  }
}

TEST_CASE("PGD training in shards: each shard is attacked on its own, each example from a start keyed by the step "
          "and its dataset index") {
  const DataSource data = halves();
  TrainOptions o;
  o.batch_size = 8;
  o.shards = 4;
  PgdOptions pgd;
  pgd.eps = 0.05f;
  pgd.steps = 2;
  pgd.random_start = true;
  pgd.seed = 3;
  Loader loader(data.train, LoaderOptions{8, true, true, false, 3, data.train_transforms(false)});
  const Batch batch = loader.next();
  Generator g1(7), g2(7);
  auto adversarial_model = make_model(tiny_vgg_config(), g1), reference = make_model(tiny_vgg_config(), g2);
  adversarial_model->train(true);

  const TrainingStep step = adversarial_training_step(o, pgd, data.mean, data.std);
  CHECK(step.reads_own_shards_only);  // a rank's loader decodes no other rank's rows
  CHECK(step.metadata.at("train.shards") == "4");
  const int64_t at = 5;
  const StepOutcome adversarial = step.run(*adversarial_model, batch, at);
  CHECK(adversarial_model->training());

  // By hand: each shard's rows attacked alone in eval mode, then the sharded classification
  // step on the attacked batch.
  const Endpoint view{"reference", reference, data.mean, data.std};
  const Tensor raw = raw_pixels(batch.inputs, view.mean, view.std, view.name);
  reference->train(false);
  std::vector<Tensor> shards_attacked;
  for (int64_t s = 0; s < 4; ++s) {
    const auto [begin, end] = shard_rows(batch.size(), s, 4);
    shards_attacked.push_back(pgd_attack_keyed(
        classifier_of(view), slice(raw, 0, begin, end).contiguous(),
        std::vector<int64_t>(batch.labels.begin() + begin, batch.labels.begin() + end), pgd, at,
        std::vector<int64_t>(batch.indices.begin() + begin, batch.indices.begin() + end)));
  }
  const Tensor attacked_raw = concat(shards_attacked, 0).contiguous();
  // The whole batch attacked at once: the same attack (each example's own, in eval mode) up
  // to the rounding of kernels that see more rows; the step's meaning is shard by shard.
  const Tensor whole_raw =
      pgd_attack_keyed(classifier_of(view), raw, batch.labels, pgd, at, batch.indices).contiguous();
  reference->train(true);
  const std::vector<float> by_shard = attacked_raw.to_vector(), whole = whole_raw.to_vector();
  int64_t differing = 0;
  for (size_t i = 0; i < by_shard.size(); ++i) differing += std::abs(by_shard[i] - whole[i]) > 1e-5f;
  CHECK(differing <= int64_t(by_shard.size()) / 100);
  const Batch attacked = with_raw_inputs(batch, view, attacked_raw);
  CHECK(max_abs(attacked.inputs - batch.inputs) > 0.05f);
  const StepOutcome expected = classification_step(*reference, attacked, 0.0f, Sharding{4, 1}, at);
  CHECK(adversarial.loss_sum == expected.loss_sum);
  CHECK(adversarial.correct == expected.correct);
  check_same_gradients(*adversarial_model, *reference);
  CHECK(all_weights(*adversarial_model) == all_weights(*reference));
}

TEST_CASE("PGD training: a resumed run equals an uninterrupted one bit for bit, and a changed attack is refused") {
  const DataSource data = halves();
  TrainOptions o = small_run(2);
  o.checkpoint_every = 1;
  PgdOptions pgd;
  pgd.eps = 0.1f;
  pgd.steps = 2;
  pgd.random_start = true;  // drawn per step: the resumed run must draw it again
  pgd.seed = 5;
  const TrainingStep step = adversarial_training_step(o, pgd, data.mean, data.std);

  const TempDir straight_dir, interrupted_dir;
  o.out_dir = straight_dir.path().string();
  Generator g1(1);
  auto straight = make_model(tiny_vgg_config(), g1);
  train(*straight, data, o, step);

  o.out_dir = interrupted_dir.path().string();
  Generator g2(1);
  auto first = make_model(tiny_vgg_config(), g2);
  struct Interrupted {};
  CHECK_THROWS_AS(train(*first, data, o, step,
                        [](const Progress& p) {
                          if (p.step == 5) throw Interrupted{};
                        }),
                  Interrupted);
  o.resume = o.out_dir + "/checkpoint.safetensors";
  const Checkpoint ck = load_checkpoint(o.resume);
  CHECK(ck.step == 5);
  CHECK(ck.metadata.at("train.pgd-norm") == "linf");
  CHECK(ck.metadata.at("train.pgd-random-start") == "yes");
  Generator g3(99);
  auto resumed = make_model(tiny_vgg_config(), g3);
  train(*resumed, data, o, step);
  CHECK(all_weights(*resumed) == all_weights(*straight));

  // Resuming with another ε, or without the attack, would continue a different run.
  PgdOptions other = pgd;
  other.eps = 0.2f;
  Generator g4(1);
  auto again = make_model(tiny_vgg_config(), g4);
  CHECK_THROWS_WITH_AS(train(*again, data, o, adversarial_training_step(o, other, data.mean, data.std)),
                       doctest::Contains("trained with --pgd-eps 0.1, this run has --pgd-eps 0.2"), UsageError);
  CHECK_THROWS_WITH_AS(train(*again, data, o), doctest::Contains("trained with --adversarial pgd, this run has --adversarial none"),
                       UsageError);

  // A checkpoint of the earlier whole-batch attack (no train.shards) is refused, not
  // continued with starts drawn another way.
  const SafetensorsFile whole = read_safetensors(o.resume);
  std::map<std::string, std::string> metadata = whole.metadata;
  metadata.erase("train.shards");
  write_safetensors(o.resume, whole.tensors, metadata);
  CHECK_THROWS_WITH_AS(train(*again, data, o, step),
                       doctest::Contains("the checkpoint records no train.shards: it was written by an earlier pgd step"),
                       UsageError);
}

TEST_CASE("robust accuracy: clean at ε = 0, falling with ε; AuA is the trapezoid; rAuA of an identity stitch is 1") {
  // The trapezoid by hand: ε 0, 0.1, 0.3 with accuracies 0.9, 0.5, 0.2 →
  // 0.1·(0.9 + 0.5)/2 + 0.2·(0.5 + 0.2)/2 = 0.07 + 0.07 = 0.14; and 0.8, 0.3, 0.1 →
  // 0.055 + 0.04 = 0.095, so rAuA = 0.095 / 0.14.
  const std::vector<float> grid = {0.0f, 0.1f, 0.3f};
  const double end_area = area_under_accuracy(grid, {0.9, 0.5, 0.2});
  CHECK(end_area == doctest::Approx(0.14).epsilon(1e-6));
  CHECK(area_under_accuracy(grid, {0.8, 0.3, 0.1}) / end_area == doctest::Approx(0.095 / 0.14).epsilon(1e-6));
  CHECK_THROWS_AS(area_under_accuracy({0.0f}, {1.0}), Error);

  // A linear classifier on the pixels, whose decisions PGD can move (the tiny VGG's
  // random weights give nearly constant logits).
  const Tensor weight = random_tensor({256, 10}, 9, -1.0f, 1.0f);
  const RawClassifier linear = [&](const Tensor& raw) { return matmul(reshape(raw, {raw.size(0), 256}), weight); };
  const Tensor x = random_tensor({24, 1, 16, 16}, 8, 0.0f, 1.0f);
  std::vector<int64_t> labels = predicted(linear, x);
  for (size_t n = 0; n < 6; ++n) labels[n] = (labels[n] + 1) % 10;  // a quarter wrong when clean
  PgdOptions attack;
  attack.steps = 4;
  const std::vector<float> eps = {0.0f, 0.01f, 0.1f};
  const std::vector<double> curve = robust_accuracy(linear, x, labels, eps, attack, 10);
  CHECK(curve[0] == doctest::Approx(0.75));
  CHECK(curve[0] == accuracy(linear, x, labels));
  CHECK(curve[1] <= curve[0]);
  CHECK(curve[2] < curve[1]);
  CHECK(curve[2] < 0.5);

  // An identity stitch into the same model is that model: the same curve, rAuA 1.
  const Endpoint b = stitch_fixture_model("B");
  StitchPair pair(b, 3, b, 3, {1, 16, 16});
  Stitch s(pair.shapes());
  s.init_identity();
  attack.eps = 0.1f;
  const std::vector<int64_t> b_labels = predicted(classifier_of(b), x);
  const Tensor on_end = pgd_attack(classifier_of(b), x, b_labels, attack);
  const Tensor on_stitched = pgd_attack([&](const Tensor& raw) { return pair.stitched_logits(s, raw); }, x, b_labels, attack);
  CHECK(max_abs(on_end - x) > 0.09f);
  CHECK(on_stitched.to_vector() == on_end.to_vector());
}

TEST_CASE("stitch sweep: --raua-eps adds rAuA to every cell") {
  // An end model trained here, whose accuracy PGD can lower.
  const DataSource data = halves();
  const TrainOptions t = small_run(8);
  Generator gen(3);
  const Endpoint b{"halves model", make_model(tiny_vgg_config(), gen), data.mean, data.std};
  train(*b.model, data, t);
  b.model->train(false);
  const TempDir dir;
  StitchSweepOptions o;
  o.points = {{3, 3}};
  o.objectives = {"hlm"};
  o.protocols = {"standard"};
  o.train_images = 16;
  o.test_images = 16;
  o.init = "identity";
  o.train.epochs = 1;
  o.train.batch = 16;
  o.train.lr = 1e-30;  // the stitch stays the identity to within rounding: rAuA 1
  o.out_dir = dir.path().string();
  o.raua_eps = {0.0f, 0.05f, 0.1f};
  o.raua_images = 12;
  o.raua_attack.steps = 3;
  const std::vector<StitchCell> cells = run_stitch_sweep(b, b, data, o);
  REQUIRE(cells.size() == 1);
  CHECK(cells[0].raua == doctest::Approx(1.0));
  // The curve rAuA summarises falls: the end model is not robust.
  const Tensor test_images = halves_test_images(data, 12);
  std::vector<int64_t> test_labels;
  for (int64_t i = 0; i < 12; ++i) test_labels.push_back(i % 4);
  const std::vector<double> curve = robust_accuracy(classifier_of(b), test_images, test_labels, o.raua_eps, o.raua_attack);
  MESSAGE("end model's accuracy under PGD at ε 0, 0.05, 0.1: ", curve[0], ", ", curve[1], ", ", curve[2]);
  CHECK(curve[0] >= 0.75);
  CHECK(curve[2] < curve[0]);
  CHECK(read_text(dir.file("results.csv")).find(",raua\n") != std::string::npos);
  o.raua_eps.clear();
  o.out_dir = dir.file("without");
  CHECK(std::isnan(run_stitch_sweep(b, b, data, o)[0].raua));
}

TEST_CASE("PGD options: a bad norm, a negative ε, no steps or a bad ε grid is a one-line usage error") {
  PgdOptions o;
  o.norm = "l3";
  CHECK_THROWS_WITH_AS(check_pgd_options(o), doctest::Contains("--pgd-norm: unknown norm 'l3'; norms: linf, l2"),
                       UsageError);
  o.norm = "l2";
  o.eps = -0.1f;
  CHECK_THROWS_WITH_AS(check_pgd_options(o), doctest::Contains("--pgd-eps must be a finite number at least 0"),
                       UsageError);
  CHECK_THROWS_WITH_AS(check_eps_grid({0.1f, 0.05f}, "raua-eps"), doctest::Contains("--raua-eps expects at least two"),
                       UsageError);

  const TempDir dir;
  for (const auto& [words, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--pgd-norm", "l3"}, "--pgd-norm: unknown norm 'l3'; norms: linf, l2"},
           {{"--pgd-eps", "-0.1"}, "option --pgd-eps must be a finite number at least 0, got -0.1"},
           {{"--pgd-steps", "-1"}, "option --pgd-steps must be at least 1"},
           // 0 steps would leave every image clean: clean accuracy reported as robust.
           {{"--pgd-steps", "0"}, "option --pgd-steps must be at least 1 (0 steps would report clean accuracy as robust), got 0"}}) {
    std::vector<std::string> command = {"train", "--data", "modadd:7", "--model", "bilinear_mlp", "--adversarial", "pgd",
                                        "--out", dir.file("run")};
    command.insert(command.end(), words.begin(), words.end());
    const CommandOutcome r = run_adjoint(command);
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.err, message), r.err);
    CHECK(error_lines(r.err) == 1);
    CHECK(!std::filesystem::exists(dir.file("run")));
  }
  const CommandOutcome r = run_adjoint({"train", "--data", "modadd:7", "--model", "bilinear_mlp", "--adversarial", "fgsm"});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "--adversarial: unknown training 'fgsm'; choices: none, pgd"));
}
