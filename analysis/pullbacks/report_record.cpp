#include "analysis/pullbacks/report_run.h"

#include <charconv>

namespace adjoint {

// ---- the record of a report's cells -------------------------------------------------------

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

// The shortest text that reads back as the same float: 0.6, not 0.6000000238418579.
std::string float_text(float value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
}

std::string joined(const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    if (!out.empty()) out += ',';
    out += float_text(v);
  }
  return out;
}

std::string target_name(const ReportOptions& o) {
  switch (o.target) {
    case ReportOptions::Target::Predicted: return "predicted";
    case ReportOptions::Target::Label: return "label";
    case ReportOptions::Target::Fixed: return cat(o.target_class);
  }
  return "";
}

struct RecordEntry {
  const char* key;  // the option's name where it is one
  std::string (*value)(const ReportOptions& o, int64_t images);
};

// Every option that changes a cell's numbers or its pictures. The image count is one: the
// focus mosaics are drawn from the whole set, and the expensive set is part of it.
const RecordEntry kRecordEntries[] = {
    {"images", [](const ReportOptions&, int64_t n) { return cat(n); }},
    {"methods", [](const ReportOptions& o, int64_t) {
       return joined(o.methods.empty() ? explanation_methods() : resolve_methods(o.methods));
     }},
    {"metrics", [](const ReportOptions& o, int64_t) { return joined(resolve_metrics(o.metrics)); }},
    {"target", [](const ReportOptions& o, int64_t) { return target_name(o); }},
    {"batch", [](const ReportOptions& o, int64_t) { return cat(o.batch_size); }},
    {"perturbations", [](const ReportOptions& o, int64_t) { return cat(o.perturbations); }},
    {"metric-settings", [](const ReportOptions& o, int64_t) { return describe(o.metric_settings); }},
    {"expensive-count", [](const ReportOptions& o, int64_t n) { return cat(expensive_images(o, n)); }},
    {"randomisation-layers", [](const ReportOptions& o, int64_t) { return cat(o.randomisation_layers); }},
    {"seed", [](const ReportOptions& o, int64_t) { return cat(o.metric_seed, " explain ", o.explain.seed); }},
    {"tau-relu", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.relu); }},
    {"tau-gelu", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.gelu); }},
    {"tau-silu", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.silu); }},
    {"tau-maxpool", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.max_pool); }},
    {"tau-attention", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.attention); }},
    {"ascent-steps", [](const ReportOptions& o, int64_t) { return cat(o.explain.ascent_steps); }},
    {"ascent-alpha", [](const ReportOptions& o, int64_t) { return float_text(o.explain.ascent_alpha); }},
    {"clip", [](const ReportOptions& o, int64_t) { return std::string(o.explain.ascent_clip ? "yes" : "no"); }},
    {"range", [](const ReportOptions& o, int64_t) {
       return cat(float_text(o.explain.range.lo), ",", float_text(o.explain.range.hi));
     }},
    {"smoothgrad-samples", [](const ReportOptions& o, int64_t) {
       return cat(o.explain.smoothgrad_samples, " sigma ", float_text(o.explain.smoothgrad_sigma));
     }},
    {"ig-steps", [](const ReportOptions& o, int64_t) { return cat(o.explain.ig_steps, " ", o.explain.ig_rule); }},
    {"baseline", [](const ReportOptions& o, int64_t) {
       return o.explain.baseline.defined() ? cat("given ", o.explain.baseline.shape()) : std::string("zeros");
     }},
    {"gradcam-block", [](const ReportOptions& o, int64_t) { return o.explain.gradcam_block; }},
    {"max-batch", [](const ReportOptions& o, int64_t) { return cat(o.explain.max_batch); }},
    {"examples", [](const ReportOptions& o, int64_t n) {
       return cat(o.picture_images < 0 ? n : std::min(o.picture_images, n));
     }},
    {"normalisation", [](const ReportOptions& o, int64_t) {
       return cat("mean ", joined(o.normalisation.mean), " std ", joined(o.normalisation.std));
     }},
    {"scale", [](const ReportOptions& o, int64_t) { return cat(o.scale); }},
};

}  // namespace

Provenance report_record(const ReportOptions& o, int64_t images) {
  Provenance record = o.cells.identity;
  for (const RecordEntry& e : kRecordEntries) record[e.key] = e.value(o, images);
  return record;
}

}  // namespace adjoint
