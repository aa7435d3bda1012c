#include "analysis/stitching/figures.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "analysis/common/figure.h"
#include "analysis/common/heatmap.h"
#include "analysis/stitching/protocol.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/table.h"
#include "ops/layout.h"

namespace adjoint {

namespace {

// One objective × protocol: the blocks along each axis, in increasing order, and the scores.
struct LayerMap {
  std::vector<size_t> rows, cols;               // front blocks, end blocks
  std::vector<std::string> row_names, col_names;  // "2 layer1.1"
  std::vector<double> score;                    // rows × cols, NaN where not measured
};

LayerMap layer_map(const std::vector<const StitchCell*>& cells) {
  std::map<size_t, std::string> fronts, ends;
  for (const StitchCell* c : cells) fronts[c->front_block] = c->front_name, ends[c->end_block] = c->end_name;
  LayerMap m;
  for (const auto& [block, name] : fronts) m.rows.push_back(block), m.row_names.push_back(cat(block, " ", name));
  for (const auto& [block, name] : ends) m.cols.push_back(block), m.col_names.push_back(cat(block, " ", name));
  m.score.assign(m.rows.size() * m.cols.size(), NAN);
  const auto at = [](const std::vector<size_t>& axis, size_t block) {
    return size_t(std::find(axis.begin(), axis.end(), block) - axis.begin());
  };
  for (const StitchCell* c : cells) m.score[at(m.rows, c->front_block) * m.cols.size() + at(m.cols, c->end_block)] = c->relative_score;
  return m;
}

// The colour range of a map: from its lowest score rounded down to a tenth (at most 0.5, so
// that a map of high scores still shows how high) to 1, or its highest score rounded up to
// a tenth when a stitch beats the end model.
std::pair<double, double> colour_range(const std::vector<double>& scores) {
  double lo = 0.5, hi = 1.0;
  for (double v : scores)
    if (std::isfinite(v)) lo = std::min(lo, std::floor(v * 10) / 10), hi = std::max(hi, std::ceil(v * 10) / 10);
  return {std::max(lo, 0.0), hi};
}

}  // namespace

void write_layer_maps(const std::string& dir, const std::string& title, const std::vector<StitchCell>& cells) {
  // Objective × protocol in the order the sweep met them.
  std::vector<std::pair<std::string, std::string>> kinds;
  std::map<std::pair<std::string, std::string>, std::vector<const StitchCell*>> by_kind;
  for (const StitchCell& c : cells) {
    const auto kind = std::make_pair(c.objective, c.protocol);
    if (!by_kind.count(kind)) kinds.push_back(kind);
    by_kind[kind].push_back(&c);
  }
  std::string md = cat("# Layer × layer stitching maps: ", title,
                       "\n\nRelative score (stitched accuracy / end model's accuracy) of a stitch from the front "
                       "model's block (row) into the end model's block (column); empty: not measured.\n");
  for (const auto& [objective, protocol] : kinds) {
    const LayerMap m = layer_map(by_kind.at({objective, protocol}));
    const std::string stem = cat(dir, "/layer_map_", objective, "_", protocol);
    Table table{{"front_block"}};
    table.header.insert(table.header.end(), m.col_names.begin(), m.col_names.end());
    for (size_t r = 0; r < m.rows.size(); ++r) {
      std::vector<std::string> row = {m.row_names[r]};
      for (size_t c = 0; c < m.cols.size(); ++c) row.push_back(measured(m.score[r * m.cols.size() + c], 3));
      table.add_row(row);
    }
    write_file_atomic(stem + ".csv", table.csv());
    table.header[0] = "front \\ end";
    md += cat("\n## ", objective, ", ", protocol, "\n\n", table.markdown());
    const auto [lo, hi] = colour_range(m.score);
    Figure(HeatMap{.title = cat(title, ": ", objective, ", ", protocol, " stitch, relative score"),
                   .x_label = "end model's block (into)",
                   .y_label = "front model's block (from)",
                   .rows = int64_t(m.rows.size()),
                   .cols = int64_t(m.cols.size()),
                   .values = m.score,
                   .row_labels = m.row_names,
                   .col_labels = m.col_names,
                   .lo = lo,
                   .hi = hi,
                   .scale = ColourScale::Sequential,
                   .range_note = cat("relative score = stitched accuracy / end model's accuracy; colour scale from the "
                                     "data: white ", lo, " to red ", hi),
                   .print_values = true})
        .write(stem);
  }
  write_file_atomic(dir + "/layer_maps.md", md);
}

void write_iri_grid(const std::string& path, const std::string& title, const Tensor& targets, const Tensor& starts,
                    const Tensor& iris, const std::vector<double>& distance, int64_t count) {
  check(targets.dim() == 4 && starts.shape() == targets.shape() && iris.shape() == targets.shape() &&
            int64_t(distance.size()) == targets.size(0),
        "IRI grid: targets ", targets.shape(), ", starts ", starts.shape(), ", IRIs ", iris.shape(), " and ",
        distance.size(), " distances disagree");
  const int64_t n = std::min(count, targets.size(0));
  const int64_t scale = std::max<int64_t>(1, 96 / std::max(targets.size(2), targets.size(3)));
  const auto picture = [&](const Tensor& batch, int64_t i) { return render_input(squeeze(slice(batch, 0, i, i + 1), 0), {}, scale); };
  std::vector<SheetColumn> columns;
  for (int64_t i = 0; i < n; ++i)
    columns.push_back({cat("image ", i),
                       {{picture(targets, i), "x (target)"},
                        {picture(starts, i), "x0 (start)"},
                        {picture(iris, i), cat("x' dist ", measured(distance[size_t(i)], 3))}}});
  // The grid as PNG at `path` and as SVG beside it.
  const Figure grid(ImageGrid{title, columns});
  write_file_atomic(path, grid.png());
  const size_t dot = path.rfind('.');
  write_file_atomic((dot == std::string::npos ? path : path.substr(0, dot)) + ".svg", grid.svg());
}

}  // namespace adjoint
