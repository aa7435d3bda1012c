// Figures drawn with Cairo: line charts, heat-maps with a colour bar, and grids of images,
// each drawn once and written as PNG (anti-aliased pixels) and SVG (vector) from the same
// drawing, with real text in DejaVu Sans.
//
// Every figure has a title and labelled axes; the axes carry round tick values (the "nice
// numbers" rule of nice_ticks below); every heat-map has a colour bar with values and says
// where its colour range came from (the data, or a fixed range).
//
//   Figure f(LineChart{.title = "...", .x_label = "step", .y_label = "loss", .x = steps,
//                      .series = {{"train", losses, kSeriesColours[0]}}});
//   f.write(out + "/loss");   // loss.png and loss.svg
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/common/heatmap.h"

struct _cairo;  // cairo_t, kept out of this header

namespace adjoint {

// Distinct line colours for the series of a chart, in order.
extern const Rgb kSeriesColours[8];

struct LineSeries {
  std::string label;
  std::vector<double> y;  // one value per x; a non-finite value leaves a gap
  Rgb colour;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<double> x;
  std::vector<LineSeries> series;
  bool log_x = false;  // a logarithmic x axis (x > 0)
  // The y range; NaN: from the data, widened to round tick values.
  double y_min = NAN, y_max = NAN;
};

// How values become colours: a diverging blue–white–red scale whose white is the middle
// of [lo, hi] (0 for a symmetric range), or a sequential white-to-red scale from lo to hi.
enum class ColourScale { Diverging, Sequential };

struct HeatMap {
  std::string title, x_label, y_label;  // x: the columns, y: the rows
  int64_t rows = 0, cols = 0;
  std::vector<double> values;  // rows × cols, row-major; non-finite: a grey cell, "not measured"
  std::vector<std::string> row_labels, col_labels;  // empty: the indices
  double lo = 0, hi = 1;                            // the colour range, values clamped to it
  ColourScale scale = ColourScale::Sequential;
  // Says where the colour range comes from, under the colour bar: "scale from the data",
  // "scale fixed at -1 to 1".
  std::string range_note;
  bool print_values = false;  // each cell's value in it, two decimals (when the cells are large enough)
};

// The range of the finite values (lo < hi: a constant gives [v − 0.5, v + 0.5]; none gives [0, 1]).
std::pair<double, double> data_range(const std::vector<double>& values);

struct ImageGrid {
  std::string title;  // empty: none (a contact sheet)
  std::vector<SheetColumn> columns;  // heatmap.h: a label over each column, captioned images
};

// Round tick values covering [lo, hi]: about `target` multiples of 1, 2 or 5 × 10^k, the
// first ≥ lo and the last ≤ hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);
// The range widened to the nearest round ticks outside it (for an axis that starts and ends on a tick).
std::pair<double, double> nice_range(double lo, double hi, int target = 5);
// A tick label with as many decimals as the step between ticks needs.
std::string tick_label(double value, double step);

// The colour of `value` on a heat-map's scale.
Rgb scale_colour(double value, double lo, double hi, ColourScale scale);

// One drawing, its size in pixels (PNG) or points (SVG).
class Figure {
 public:
  explicit Figure(const LineChart& chart);
  explicit Figure(const HeatMap& map);
  explicit Figure(const ImageGrid& grid);

  int64_t width() const { return width_; }
  int64_t height() const { return height_; }
  Image pixels() const;     // the drawing rasterised, as RGB
  std::string png() const;  // the PNG file's bytes
  std::string svg() const;  // the SVG file's text
  // Writes `stem`.png and `stem`.svg atomically; errors name the file.
  void write(const std::string& stem) const;

 private:
  int64_t width_ = 0, height_ = 0;
  std::function<void(_cairo*)> draw_;
};

}  // namespace adjoint
