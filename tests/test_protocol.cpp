// The evaluation protocol by input size (analysis/pullbacks/protocol.h): at 224 pixels every
// constant of the published ImageNet evaluation, and each one reaching the metrics: the
// noise the model sees, the patches set to 0, the grid, the seeds and the notes.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "analysis/pullbacks/metrics.h"
#include "analysis/pullbacks/protocol.h"
#include "analysis/pullbacks/report.h"
#include "engine/data/dataset.h"
#include "engine/data/loader.h"
#include "engine/data/open.h"
#include "engine/random.h"
#include "models/model.h"
#include "tests/support.h"
#include "models/model_source.h"

using namespace adjoint;
using adjoint::testing::grey_resnet18;
using adjoint::testing::random_tensor;
using adjoint::testing::TempDir;

namespace {

// A classifier of (N, C, H, W) images whose logit 0 is the sum of the input, that keeps
// every input it is given.
struct RecordingClassifier {
  std::vector<Tensor> seen;
  Classifier classifier() {
    return [this](const Tensor& x) {
      const Tensor xc = x.contiguous();
      seen.push_back(xc.clone());
      const int64_t n = xc.size(0), d = xc.numel() / n;
      Tensor logits = Tensor::zeros({n, 2});
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < d; ++k) logits.data()[i * 2] += xc.data()[i * d + k];
      return logits;
    };
  }
};

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("protocol: at 224 pixels every constant is the published ImageNet evaluation's") {
  const EvaluationProtocol p = evaluation_protocol(224, 224);
  CHECK(p.images == 1000);
  REQUIRE(p.shuffle_seed.has_value());
  CHECK(*p.shuffle_seed == 314);
  CHECK(p.batch == 50);
  CHECK(p.images / p.batch == 20);
  const MetricSettings& m = p.metrics;
  CHECK(m.infidelity_patches == std::vector<int64_t>{112, 56});
  CHECK(p.perturbations == 10);  // 5 per patch size
  REQUIRE(m.infidelity_noise.has_value());
  CHECK(m.infidelity_noise->lo == -1.0f);
  CHECK(m.infidelity_noise->hi == 1.0f);
  CHECK(m.faithfulness_patch == 56);
  CHECK(m.baseline == 0.0f);
  CHECK(m.patch_side * m.patch_side == 3136);
  CHECK(m.monotonicity_samples == 10);
  CHECK(m.sensitivity_samples == 10);
  CHECK(m.sensitivity_radius == 0.02);
  CHECK(m.sensitivity_radius_absolute);
  REQUIRE(m.random_logit_seed.has_value());
  CHECK(*m.random_logit_seed == 42);

  // Another size keeps the scaled defaults; the table is keyed by size alone.
  const EvaluationProtocol small = evaluation_protocol(28, 28);
  CHECK(!small.shuffle_seed.has_value());
  CHECK(small.batch == 32);
  CHECK(small.perturbations == 50);
  CHECK(small.metrics.infidelity_patches.empty());
  CHECK(!small.metrics.infidelity_noise.has_value());
  CHECK(small.metrics.patch_side == 0);
  CHECK(!small.metrics.random_logit_seed.has_value());
  CHECK(evaluation_protocol(224, 225).batch == 32);
}

TEST_CASE("protocol: infidelity's noise is U(-1, 1) when the settings say so, whatever the input range") {
  const Tensor x = Tensor::zeros({1, 3, 32, 32});
  for (const bool published : {true, false}) {
    RecordingClassifier model;
    InfidelityOptions o;
    o.patch_sizes = {16, 8};
    o.samples_per_size = 5;
    if (published) o.noise = InputRange{-1.0f, 1.0f};
    const InfidelityProbe probe = probe_infidelity(model.classifier(), x, {0}, InputRange{-3.0f, 3.0f}, o);
    CHECK(probe.samples() == 10);
    float lo = 0, hi = 0;
    for (const Tensor& t : model.seen)
      for (int64_t i = 0; i < t.numel(); ++i) lo = std::min(lo, t.data()[i]), hi = std::max(hi, t.data()[i]);
    CAPTURE(published);
    if (published) {
      CHECK(lo >= -1.0f);
      CHECK(hi <= 1.0f);
      CHECK(hi > 0.9f);  // the whole interval is used
    } else {
      CHECK(hi > 1.5f);
      CHECK(lo < -1.5f);
    }
  }
}

TEST_CASE("protocol: faithfulness correlation with a patch size sets one square patch, every channel, to 0") {
  const Tensor x = Tensor::ones({1, 3, 224, 224});
  RecordingClassifier model;
  FaithfulnessCorrelationOptions o;
  o.patch_size = 56;
  o.subsets = 6;
  const FaithfulnessCorrelationProbe probe = probe_faithfulness_correlation(model.classifier(), x, {0}, o);
  CHECK(probe.options.subset_size == 3 * 56 * 56);
  int64_t perturbed = 0;
  for (const Tensor& batch : model.seen)
    for (int64_t n = 0; n < batch.size(0); ++n) {
      if (batch.size(0) == 1 && &batch == &model.seen.front()) continue;  // the clean pass
      int64_t zeros = 0, top = 224, bottom = -1, left = 224, right = -1;
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t y = 0; y < 224; ++y)
          for (int64_t xx = 0; xx < 224; ++xx)
            if (batch.data()[((n * 3 + c) * 224 + y) * 224 + xx] == 0.0f) {
              ++zeros;
              top = std::min(top, y), bottom = std::max(bottom, y), left = std::min(left, xx), right = std::max(right, xx);
            }
      CHECK(zeros == 3 * 56 * 56);
      CHECK(bottom - top + 1 == 56);
      CHECK(right - left + 1 == 56);
      ++perturbed;
    }
  CHECK(perturbed == 6);
  // Every drop is the sum the patch held: 3·56·56 ones.
  for (double drop : probe.output_drops) CHECK(drop == doctest::Approx(3 * 56 * 56));
}

TEST_CASE("protocol: a report at 224 pixels runs the metrics with the published constants and says so") {
  Generator gen(5);
  auto model = make_model(grey_resnet18(0.0625, 224, 10), gen);
  model->train(false);
  const Tensor x = random_tensor({2, 1, 224, 224}, 9, -1.0f, 1.0f);
  const EvaluationProtocol p = evaluation_protocol(224, 224);
  TempDir dir;
  ReportOptions o;
  o.methods = {"gradient"};
  o.metrics = {"infidelity", "max_sensitivity", "random_logit", "faithfulness_correlation", "faithfulness_estimate",
               "monotonicity_correlation"};
  o.metric_settings = p.metrics;
  o.perturbations = p.perturbations;
  o.batch_size = 2;
  o.out_dir = dir.path().string();
  o.picture_images = 0;
  o.write_attributions = false;
  o.explain.range = {-2.0f, 3.0f};
  const ReportResult r = explain_report(*model, x, {}, o);
  const std::string md = read_text(dir.path() / "metrics.md");
  CHECK(md.find("10 perturbations per image, the same for every method: U(-1, 1)-noise patches of side 112 and 56, 5 each") !=
        std::string::npos);
  CHECK(md.find("10 samples in an L-inf ball of radius 0.02") != std::string::npos);
  CHECK(md.find("drawn from the model's 10 with seed 42") != std::string::npos);
  CHECK(md.find("50 random square patches of side 56, set to 0") != std::string::npos);
  CHECK(md.find("4x4 grid of 56-pixel patches (3136 pixels a step) set to 0") != std::string::npos);
  CHECK(md.find("4x4 grid of 56-pixel patches (3136 pixels a step), 10 noise samples each") != std::string::npos);
  for (const char* metric : {"infidelity", "max_sensitivity", "random_logit", "faithfulness_correlation",
                             "faithfulness_estimate", "monotonicity_correlation"}) {
    CAPTURE(metric);
    const MetricRow* row = r.table.find("gradient", metric);
    REQUIRE(row != nullptr);
    CHECK(row->summary.count + row->summary.undefined == 2);
  }
  // The random logit's other class is the seed-42 draw.
  const MetricRow* rl = r.table.find("gradient", "random_logit");
  REQUIRE(rl != nullptr);
  CHECK(report_record(o, 2).at("metric-settings").find("random logit seed 42") != std::string::npos);
  CHECK(random_other_class(3, 1000, 42, 0) == random_other_class(3, 1000, 42, 0));
  CHECK(random_other_class(3, 1000, 42, 0) != random_other_class(3, 1000, 0, 0));
}

TEST_CASE("protocol: --evaluate's images are the first of the set shuffled with the protocol's seed") {
  std::vector<float> inputs(20 * 4);
  std::vector<int64_t> labels(20);
  for (int64_t i = 0; i < 20; ++i) {
    labels[size_t(i)] = i % 5;
    for (int64_t k = 0; k < 4; ++k) inputs[size_t(i * 4 + k)] = float(i);
  }
  DataSource data;
  data.spec = "in memory";
  data.test = std::make_shared<InMemoryDataset>("twenty", Shape{1, 2, 2}, inputs, labels, 5);
  data.train = data.test;
  const Examples ex = load_examples(data, "test", 7, uint64_t(314));
  Generator gen;
  gen.set_state(314, 0);
  const std::vector<int64_t> order = permutation(20, gen);
  REQUIRE(ex.labels.size() == 7);
  for (int64_t i = 0; i < 7; ++i) {
    CHECK(ex.inputs.data()[i * 4] == float(order[size_t(i)]));
    CHECK(ex.labels[size_t(i)] == order[size_t(i)] % 5);
  }
  CHECK(order != std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
  const Examples plain = load_examples(data, "test", 3);
  CHECK(plain.inputs.data()[2 * 4] == 2.0f);
}
