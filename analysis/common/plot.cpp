#include "analysis/common/plot.h"

#include <algorithm>
#include <cmath>

#include "analysis/common/figure.h"
#include "engine/error.h"

namespace adjoint {

// The three figures are drawn by analysis/common/figure.h (Cairo); these keep the
// signatures their callers use.

Image line_chart(const std::string& title, const std::string& x_label, const std::vector<double>& x,
                 const std::vector<PlotSeries>& series, bool log_x, double y_min, double y_max) {
  LineChart chart{.title = title, .x_label = x_label, .y_label = "", .x = x, .series = {}, .log_x = log_x,
                  .y_min = y_min, .y_max = y_max};
  for (const PlotSeries& s : series) chart.series.push_back({s.label, s.y, s.colour});
  return Figure(chart).pixels();
}

Image matrix_heatmap(const std::string& title, const std::vector<double>& values, int64_t rows, int64_t cols,
                     const std::vector<std::string>& labels, double scale, int64_t /*cell: chosen by the figure*/) {
  check(int64_t(values.size()) == rows * cols, "matrix_heatmap: ", values.size(), " values for ", rows, "×", cols);
  check(scale > 0 && std::isfinite(scale), "matrix_heatmap: the colour scale must be positive, got ", scale);
  // The labels name the rows and the columns alike (a square matrix); missing ones are indices.
  const auto axis = [&](int64_t n) {
    std::vector<std::string> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(i < int64_t(labels.size()) ? labels[size_t(i)] : std::to_string(i));
    return out;
  };
  HeatMap map{.title = title, .x_label = "", .y_label = "", .rows = rows, .cols = cols, .values = values,
              .row_labels = axis(rows), .col_labels = axis(cols), .lo = -scale, .hi = scale,
              .scale = ColourScale::Diverging, .range_note = cat("scale fixed at -", scale, " to +", scale),
              .print_values = false};
  return Figure(map).pixels();
}

Image score_matrix(const std::string& title, const std::vector<double>& values, int64_t rows, int64_t cols,
                   const std::vector<std::string>& row_labels, const std::vector<std::string>& column_labels,
                   const std::string& row_axis, const std::string& column_axis, double lo, double hi) {
  check(int64_t(values.size()) == rows * cols && int64_t(row_labels.size()) == rows &&
            int64_t(column_labels.size()) == cols,
        "score_matrix: ", values.size(), " values, ", row_labels.size(), " row and ", column_labels.size(),
        " column labels for ", rows, "×", cols);
  check(hi > lo, "score_matrix: the colour range [", lo, ", ", hi, "] is empty");
  HeatMap map{.title = title, .x_label = column_axis, .y_label = row_axis, .rows = rows, .cols = cols,
              .values = values, .row_labels = row_labels, .col_labels = column_labels, .lo = lo, .hi = hi,
              .scale = ColourScale::Sequential, .range_note = cat("colour: white ", lo, " to red ", hi),
              .print_values = true};
  return Figure(map).pixels();
}

}  // namespace adjoint
