#include "analysis/common/plot.h"

#include <algorithm>
#include <cmath>

#include "analysis/common/figure.h"
#include "engine/error.h"

namespace adjoint {

namespace {

const Rgb kBlack{0, 0, 0}, kGrey{200, 200, 200};

// A value at enough decimals to tell the ticks of a range `span` wide apart.
std::string tick_value(double v, double span) {
  const int decimals = std::clamp(int(std::ceil(-std::log10(std::max(span, 1e-12)))) + 2, 2, 10);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

// The line charts and the fixed-scale heat-map are drawn by analysis/common/figure.h
// (Cairo); these keep the signatures their callers use.

Image line_chart(const std::string& title, const std::string& x_label, const std::vector<double>& x,
                 const std::vector<PlotSeries>& series, bool log_x, double y_min, double y_max) {
  return line_chart(title, x_label, "", x, series, log_x, y_min, y_max);
}

Image line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                 const std::vector<double>& x, const std::vector<PlotSeries>& series, bool log_x, double y_min,
                 double y_max) {
  LineChart chart{.title = title, .x_label = x_label, .y_label = y_label, .x = x, .series = {}, .log_x = log_x,
                  .y_min = y_min, .y_max = y_max};
  for (const PlotSeries& s : series) chart.series.push_back({s.label, s.y, s.colour});
  return Figure(chart).pixels();
}

HeatmapFigure data_scaled_heatmap(const std::string& title, const std::vector<double>& values, int64_t rows,
                                  int64_t cols, const std::vector<std::string>& labels, const std::string& axis,
                                  const std::string& measure, int64_t cell) {
  check(int64_t(values.size()) == rows * cols, "data_scaled_heatmap: ", values.size(), " values for ", rows, "×", cols);
  HeatmapFigure f;
  f.lo = 1e300, f.hi = -1e300;
  for (double v : values)
    if (std::isfinite(v)) f.lo = std::min(f.lo, v), f.hi = std::max(f.hi, v);
  if (f.lo > f.hi) f.lo = 0, f.hi = 1;        // nothing finite
  if (!(f.hi > f.lo)) f.lo = f.hi - 1;         // one value: all red
  const double span = f.hi - f.lo;
  int64_t label_width = text_width(axis);
  for (const std::string& l : labels) label_width = std::max(label_width, text_width(l));
  f.cell = cell, f.left = label_width + 12, f.top = 34 + text_height() + 10;
  f.bar_left = f.left + cols * cell + 16, f.bar_width = 14;
  const int64_t tick_width = text_width(tick_value(-std::max(std::abs(f.lo), std::abs(f.hi)), span));
  const std::string legend = cat("colour: ", measure, ", white ", tick_value(f.lo, span), " to red ", tick_value(f.hi, span),
                                 "; grey: undefined");
  const int64_t width = std::max({f.bar_left + f.bar_width + 6 + tick_width + 8, text_width(title, 2) + 16, text_width(legend) + 16});
  f.image = Image(width, f.top + rows * cell + 2 * text_height() + 40);
  Image& img = f.image;
  draw_text(img, title, 8, 8, kBlack, 2);
  draw_text(img, axis, 4, f.top - text_height() - 4, kBlack);  // names the rows' labels
  const auto colour_of = [&](double v) {
    return std::isfinite(v) ? diverging_colour(float(std::clamp((v - f.lo) / span, 0.0, 1.0)), 1.0f) : kGrey;
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const Rgb colour = colour_of(values[size_t(r * cols + c)]);
      for (int64_t y = 0; y < cell; ++y)
        for (int64_t x = 0; x < cell; ++x) img.set(f.left + c * cell + x, f.top + r * cell + y, colour);
    }
  // Labels at up to eight evenly spaced rows and columns; the columns' axis named below them.
  const int64_t every = std::max<int64_t>(1, (rows + 7) / 8), bottom = f.top + rows * cell;
  for (int64_t i = 0; i < rows && i < int64_t(labels.size()); i += every) {
    draw_text(img, labels[size_t(i)], 4, f.top + i * cell + cell / 2 - text_height() / 2, kBlack);
    draw_text(img, labels[size_t(i)], f.left + i * cell, bottom + 4 + (i / every % 2) * (text_height() + 2), kBlack);
  }
  draw_text(img, axis, f.left + cols * cell / 2 - text_width(axis) / 2, bottom + 2 * text_height() + 10, kBlack);
  draw_text(img, legend, 8, bottom + 3 * text_height() + 18, kBlack);
  // The colour bar: hi at the top row of pixels to lo at the bottom, five ticks with their values.
  const int64_t bar_height = rows * cell;
  for (int64_t y = 0; y < bar_height; ++y) {
    const double v = f.hi - span * double(y) / double(std::max<int64_t>(1, bar_height - 1));
    for (int64_t x = 0; x < f.bar_width; ++x) img.set(f.bar_left + x, f.top + y, colour_of(v));
  }
  for (int64_t i = 0; i <= 4; ++i) {
    const int64_t y = f.top + (bar_height - 1) * i / 4;
    for (int64_t x = 0; x < 4; ++x) img.set(f.bar_left + f.bar_width + x, y, kBlack);
    draw_text(img, tick_value(f.hi - span * double(i) / 4, span), f.bar_left + f.bar_width + 6,
              std::clamp<int64_t>(y - text_height() / 2, 0, img.height - text_height()), kBlack);
  }
  return f;
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
