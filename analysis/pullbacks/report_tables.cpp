#include "analysis/pullbacks/report_run.h"

#include <cmath>
#include <cstdio>

#include "engine/io/csv.h"
#include "engine/io/json.h"
#include "engine/io/table.h"

namespace adjoint {

namespace {

// ---- formatting ----------------------------------------------------------------------


// Numbers for JSON, where NaN and infinity have no spelling: null.
Json json_number(double v) { return std::isfinite(v) ? Json(v) : Json(); }

}  // namespace

std::string number(double v) {
  if (!std::isfinite(v)) return csv_number(v);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// ---- tables --------------------------------------------------------------------------------

namespace {

// A number for a person: a dash where it is undefined (one value has no spread).
std::string shown(double v) { return std::isfinite(v) ? number(v) : "—"; }

// A mean for a person: "not computable" where no value was defined.
std::string shown_mean(const Summary& s) { return s.count > 0 ? number(s.mean) : "not computable"; }

}  // namespace

const MetricRow* MetricTable::find(const std::string& method, const std::string& metric) const {
  for (const MetricRow& r : rows)
    if (r.method == method && r.metric == metric) return &r;
  return nullptr;
}

std::string direction_arrow(const MetricInfo& info) { return info.higher_is_better ? "↑" : "↓"; }

std::string table_csv(const MetricTable& t) {
  Table out{{"method", "metric", "direction", "higher_is_better", "mean", "std", "ci_low", "ci_high", "count", "undefined",
             "images", "note"}};
  for (const MetricColumn& col : t.metrics)
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r) continue;
      const Summary& s = r->summary;
      out.add_row({method, col.info.name, col.info.direction(), col.info.higher_is_better ? "true" : "false",
                   number(s.mean), number(s.std), number(s.ci_low), number(s.ci_high), cat(s.count), cat(s.undefined),
                   cat(col.images), col.note});
    }
  for (const ModelFigure& f : t.model_figures) {
    const Summary& s = f.summary;
    out.add_row({"model", f.column.info.name, f.column.info.direction(), f.column.info.higher_is_better ? "true" : "false",
                 number(s.mean), number(s.std), number(s.ci_low), number(s.ci_high), cat(s.count), cat(s.undefined),
                 cat(f.column.images), f.column.note});
  }
  return out.csv();
}

std::string table_json(const MetricTable& t) {
  Json root = Json::object();
  Json context = Json::object();
  for (const auto& [key, value] : t.context) context[key] = value;
  root["context"] = context;
  root["confidence"] = t.confidence;
  root["methods"] = Json::array();
  for (const std::string& m : t.methods) root["methods"].push_back(m);
  root["metrics"] = Json::array();
  for (const MetricColumn& col : t.metrics)
    root["metrics"].push_back(Json(Json::Object{{"name", col.info.name},
                                                {"higher_is_better", col.info.higher_is_better},
                                                {"direction", col.info.direction()},
                                                {"arrow", direction_arrow(col.info)},
                                                {"description", col.info.description},
                                                {"images", col.images},
                                                {"note", col.note}}));
  root["results"] = Json::array();
  for (const MetricColumn& col : t.metrics)
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r) continue;
      const Summary& s = r->summary;
      root["results"].push_back(Json(Json::Object{{"method", method},
                                                  {"metric", col.info.name},
                                                  {"mean", json_number(s.mean)},
                                                  {"std", json_number(s.std)},
                                                  {"ci_low", json_number(s.ci_low)},
                                                  {"ci_high", json_number(s.ci_high)},
                                                  {"count", s.count},
                                                  {"undefined", s.undefined}}));
    }
  for (const ModelFigure& f : t.model_figures)
    root["results"].push_back(Json(Json::Object{{"method", "model"},
                                                {"metric", f.column.info.name},
                                                {"description", f.column.info.description},
                                                {"mean", json_number(f.summary.mean)},
                                                {"std", json_number(f.summary.std)},
                                                {"ci_low", json_number(f.summary.ci_low)},
                                                {"ci_high", json_number(f.summary.ci_high)},
                                                {"count", f.summary.count},
                                                {"undefined", f.summary.undefined}}));
  return to_json(root, 2) + "\n";
}

std::string table_markdown(const MetricTable& t) {
  std::string out = "# Explanation quality\n\n";
  for (const auto& [key, value] : t.context) out += cat("- ", key, ": ", value, "\n");
  if (!t.context.empty()) out += "\n";
  const int ci = int(std::lround(100 * t.confidence));

  // The best mean of each metric, in bold in the summary grid.
  std::map<std::string, std::string> best;
  for (const MetricColumn& col : t.metrics) {
    double best_mean = NAN;
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r || std::isnan(r->summary.mean)) continue;
      const double m = r->summary.mean;
      if (std::isnan(best_mean) || (col.info.higher_is_better ? m > best_mean : m < best_mean)) {
        best_mean = m;
        best[col.info.name] = method;
      }
    }
  }
  for (const ModelFigure& f : t.model_figures) {
    const Summary& s = f.summary;
    const std::string interval =
        s.count > 1 ? cat(" ± ", number(s.std), " (", ci, "% CI [", number(s.ci_low), ", ", number(s.ci_high), "])") : "";
    out += cat("\n## the model: ", f.column.info.name, "\n\n", f.column.info.description, ": ", shown_mean(s), interval,
               " over ", s.count, " ", f.column.unit, ".\n");
  }

  out += "## Summary\n\nMean over images; ↑ higher is better, ↓ lower is better; the best method of each metric in bold.\n\n";
  Table summary{{"method"}};
  summary.align = {Align::Left};
  for (const MetricColumn& col : t.metrics) {
    summary.header.push_back(cat(col.info.name, " ", direction_arrow(col.info)));
    summary.align.push_back(Align::Right);
  }
  for (const std::string& method : t.methods) {
    std::vector<std::string> row = {method};
    for (const MetricColumn& col : t.metrics) {
      const MetricRow* r = t.find(method, col.info.name);
      const std::string v = r ? shown_mean(r->summary) : "—";
      const auto b = best.find(col.info.name);
      row.push_back(b != best.end() && b->second == method ? cat("**", v, "**") : v);
    }
    summary.add_row(row);
  }
  out += summary.markdown();

  for (const MetricColumn& col : t.metrics) {
    out += cat("\n## ", col.info.name, " ", direction_arrow(col.info), " (", col.info.direction(), ")\n\n",
               col.info.description, ". ", col.images, " ", col.unit, col.note.empty() ? "" : "; " + col.note, ".\n\n");
    Table rows{{"method", "mean ± std", cat(ci, "% CI"), "n", "undefined"}};
    rows.align = {Align::Left, Align::Right, Align::Right, Align::Right, Align::Right};
    std::vector<std::string> not_computable;
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r) {
        rows.add_row({method, "—", "—", "0", "—"});
        continue;
      }
      const Summary& s = r->summary;
      if (s.count == 0) not_computable.push_back(method);
      rows.add_row({method, s.count > 0 ? cat(number(s.mean), " ± ", shown(s.std)) : shown_mean(s),
                    s.count > 1 ? cat("[", number(s.ci_low), ", ", number(s.ci_high), "]") : "—", cat(s.count),
                    cat(s.undefined)});
    }
    out += rows.markdown();
    if (!not_computable.empty()) {
      std::string methods;
      for (const std::string& m : not_computable) methods += cat(methods.empty() ? "" : ", ", m);
      out += cat("\nNot computable for ", methods, ": the metric is undefined on every one of its ", col.unit,
                 col.info.undefined_when.empty() ? std::string(".") : cat(", as it is for ", col.info.undefined_when, "."),
                 "\n");
    }
  }
  return out;
}

}  // namespace adjoint
