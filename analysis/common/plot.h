// Plots for analysis results, as pictures (analysis/common/heatmap.h's Image): line charts of
// values over training steps and a matrix as a heat-map, drawn by analysis/common/figure.h
// (Cairo: anti-aliased, real text, round ticks, a colour bar on every heat-map). New code
// can use figure.h directly, which also writes SVG.
#pragma once
#include <string>
#include <vector>

#include "analysis/common/heatmap.h"

namespace adjoint {

struct PlotSeries {
  std::string label;
  std::vector<double> y;  // one value per x; non-finite values leave a gap
  Rgb colour;
};

// A line chart of series over shared x values, on a log x axis when `log_x` (x > 0).
// The y axis spans the data's range (or [y_min, y_max] when they are finite).
Image line_chart(const std::string& title, const std::string& x_label, const std::vector<double>& x,
                 const std::vector<PlotSeries>& series, bool log_x, double y_min, double y_max);

// An n×m matrix (row-major) as coloured cells on the diverging scale ±scale (blue < 0 <
// red), with a title, row/column labels, and a colour bar that says the scale is fixed.
// `cell` is no longer used: the figure sizes its cells.
Image matrix_heatmap(const std::string& title, const std::vector<double>& values, int64_t rows, int64_t cols,
                     const std::vector<std::string>& labels, double scale, int64_t cell);

// A rows×cols table of scores (row-major) with labels of its own for rows and columns:
// each cell white at `lo` to red at `hi` (clamped), its value printed in it with two
// decimals, a non-finite value a grey cell marked "-". `row_axis` and `column_axis` say
// what the rows and columns are. Columns are as wide as their widest label.
Image score_matrix(const std::string& title, const std::vector<double>& values, int64_t rows, int64_t cols,
                   const std::vector<std::string>& row_labels, const std::vector<std::string>& column_labels,
                   const std::string& row_axis, const std::string& column_axis, double lo, double hi);

}  // namespace adjoint
