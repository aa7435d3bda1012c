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

// As above, with the y axis named (`y_label`) and an automatic y range padded by 5% on each
// side, so that a line at the data's extreme (an accuracy of 0) stays visible above the axis.
Image line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                 const std::vector<double>& x, const std::vector<PlotSeries>& series, bool log_x, double y_min,
                 double y_max);

// A rows×rows matrix (row-major) as a heat-map scaled to its data: white at its smallest
// finite value to red at its largest (grey: not finite), a colour bar at the right with five
// tick values, the rows and columns named by `axis` and the bar by `measure`. The layout is
// returned with the image (for tests): cell (r, c) spans x ∈ [left + c·cell, left + (c+1)·cell),
// y ∈ [top + r·cell, ...); the bar spans x ∈ [bar_left, bar_left + bar_width), y ∈ [top,
// top + rows·cell), red at the top (hi) to white at the bottom (lo).
struct HeatmapFigure {
  Image image;
  int64_t left = 0, top = 0, cell = 0, bar_left = 0, bar_width = 0;
  double lo = 0, hi = 0;
};
HeatmapFigure data_scaled_heatmap(const std::string& title, const std::vector<double>& values, int64_t rows,
                                  int64_t cols, const std::vector<std::string>& labels, const std::string& axis,
                                  const std::string& measure, int64_t cell);

// A rows×cols table of scores (row-major) with labels of its own for rows and columns:
// each cell white at `lo` to red at `hi` (clamped), its value printed in it with two
// decimals, a non-finite value a grey cell marked "-". `row_axis` and `column_axis` say
// what the rows and columns are. Columns are as wide as their widest label.
Image score_matrix(const std::string& title, const std::vector<double>& values, int64_t rows, int64_t cols,
                   const std::vector<std::string>& row_labels, const std::vector<std::string>& column_labels,
                   const std::string& row_axis, const std::string& column_axis, double lo, double hi);

}  // namespace adjoint
