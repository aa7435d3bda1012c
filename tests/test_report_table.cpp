// The metric table of the explanation report (analysis/pullbacks/report.h, report_metrics()): one
// row per metric of the catalogue, in its order, and the cost model it drives.
#include <doctest/doctest.h>

#include "analysis/pullbacks/report.h"
#include "engine/error.h"

using namespace adjoint;

TEST_CASE("report table: one row per catalogue metric, in its order, with its direction") {
  const std::vector<ReportMetric>& table = report_metrics();
  REQUIRE(table.size() == metric_catalogue().size());
  for (size_t i = 0; i < table.size(); ++i) {
    CAPTURE(table[i].info.name);
    CHECK(table[i].info.name == metric_catalogue()[i].name);
    CHECK(table[i].info.higher_is_better == metric_catalogue()[i].higher_is_better);
    CHECK(bool(table[i].score));
    CHECK_FALSE(table[i].help.empty());
  }
  CHECK(find_report_metric("randomisation") == find_report_metric("model_parameter_randomisation"));
  CHECK(find_report_metric("accuracy") == nullptr);
  CHECK_FALSE(is_expensive_metric("accuracy"));
  std::vector<std::string> expensive, named_only;
  for (const ReportMetric& m : table) {
    if (m.expensive) expensive.push_back(m.info.name);
    if (!m.by_default) named_only.push_back(m.info.name);
  }
  CHECK(expensive == std::vector<std::string>{"max_sensitivity", "monotonicity_correlation",
                                              "model_parameter_randomisation", "focus"});
  CHECK(named_only == std::vector<std::string>{"model_parameter_randomisation", "focus"});
  CHECK_THROWS_WITH_AS(resolve_metrics({"fidelity"}),
                       doctest::Contains("(randomisation for model_parameter_randomisation; none for no metrics)"),
                       UsageError);
}

TEST_CASE("report table: the cost of probes and re-explanations, batch by batch") {
  // 4 images of 16×16 in batches of 2, the expensive metrics on the first 3, the gradient
  // (one pass per map). Patches: side ceil(16/8) = 2, an 8×8 grid of 64.
  // Batch 1 (2 images, 2 expensive): faithfulness estimate 2·64 forward passes, monotonicity
  // 2·10·64, each a third of a pass; maps 2, max-sensitivity 2·10 re-explanations.
  // Batch 2 (2 images, 1 expensive): 2·64 and 1·10·64 forward passes; maps 2, 10 more.
  ReportOptions o;
  o.methods = {"gradient"};
  o.metrics = {"faithfulness_estimate", "monotonicity_correlation", "max_sensitivity"};
  o.batch_size = 2;
  o.expensive_count = 3;
  const double batch1 = (2 * 64 + 2 * 10 * 64) / 3.0 + 2 + 20;
  const double batch2 = (2 * 64 + 1 * 10 * 64) / 3.0 + 2 + 10;
  CHECK(report_cost(o, 4, 16, 16, 1) == doctest::Approx(batch1 + batch2));
  // Randomisation re-explains each expensive image once per layer re-initialised.
  o.metrics = {"randomisation"};
  o.randomisation_layers = 2;
  CHECK(report_cost(o, 4, 16, 16, 5) == doctest::Approx(4 + 3 * 2));
}
