#include "analysis/common/plot.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

const Rgb kBlack{0, 0, 0}, kGrey{200, 200, 200};

void draw_line(Image& img, double x0, double y0, double x1, double y1, Rgb c) {
  const int64_t steps = int64_t(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
  for (int64_t i = 0; i <= steps; ++i) {
    const double t = double(i) / double(steps);
    const int64_t x = std::llround(x0 + t * (x1 - x0)), y = std::llround(y0 + t * (y1 - y0));
    for (int64_t dy = 0; dy < 2; ++dy)  // two pixels thick
      if (x >= 0 && x < img.width && y + dy >= 0 && y + dy < img.height) img.set(x, y + dy, c);
  }
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::abs(v) >= 1000 && std::abs(v) < 1e7 ? "%.0f" : "%.3g", v);
  return buf;
}

// A value at enough decimals to tell the ticks of a range `span` wide apart.
std::string tick_value(double v, double span) {
  const int decimals = std::clamp(int(std::ceil(-std::log10(std::max(span, 1e-12)))) + 2, 2, 10);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

Image draw_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<double>& x, const std::vector<PlotSeries>& series, bool log_x, double y_min,
                      double y_max, bool pad);

}  // namespace

Image line_chart(const std::string& title, const std::string& x_label, const std::vector<double>& x,
                 const std::vector<PlotSeries>& series, bool log_x, double y_min, double y_max) {
  return draw_line_chart(title, x_label, "", x, series, log_x, y_min, y_max, false);
}

Image line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                 const std::vector<double>& x, const std::vector<PlotSeries>& series, bool log_x, double y_min,
                 double y_max) {
  return draw_line_chart(title, x_label, y_label, x, series, log_x, y_min, y_max, true);
}

namespace {

Image draw_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<double>& x, const std::vector<PlotSeries>& series, bool log_x, double y_min,
                      double y_max, bool pad) {
  const int64_t W = 520, H = 360, left = 60, right = 20, top = y_label.empty() ? 34 : 48;
  const int64_t bottom = 50 + 14 * int64_t(series.size());
  Image img(W, H + 14 * int64_t(series.size()));
  auto fx = [&](double v) { return log_x ? std::log10(std::max(v, 1e-12)) : v; };
  double x_lo = 1e300, x_hi = -1e300, lo = 1e300, hi = -1e300;
  for (double v : x) x_lo = std::min(x_lo, fx(v)), x_hi = std::max(x_hi, fx(v));
  for (const PlotSeries& s : series)
    for (double v : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (std::isfinite(y_min)) lo = y_min;
  if (std::isfinite(y_max)) hi = y_max;
  if (!(hi > lo)) hi = lo + 1;
  if (pad) {
    const double margin = 0.05 * (hi - lo);
    if (!std::isfinite(y_min)) lo -= margin;
    if (!std::isfinite(y_max)) hi += margin;
  }
  if (!(x_hi > x_lo)) x_hi = x_lo + 1;
  const double pw = double(W - left - right), ph = double(img.height - top - bottom);
  auto px = [&](double v) { return double(left) + (fx(v) - x_lo) / (x_hi - x_lo) * pw; };
  auto py = [&](double v) { return double(top) + (hi - v) / (hi - lo) * ph; };
  draw_text(img, title, left, 8, kBlack, 2);
  if (!y_label.empty()) draw_text(img, "y: " + y_label, 4, top - 10, kBlack);
  for (int64_t i = 0; i <= 4; ++i) {  // horizontal grid and y ticks
    const double v = lo + (hi - lo) * double(i) / 4;
    draw_line(img, double(left), py(v), double(W - right), py(v), kGrey);
    draw_text(img, tick_label(v), 4, int64_t(py(v)) - 4, kBlack);
  }
  for (int64_t i = 0; i <= 4; ++i) {  // x ticks
    const double f = x_lo + (x_hi - x_lo) * double(i) / 4, v = log_x ? std::pow(10.0, f) : f;
    const double at = double(left) + double(i) / 4 * pw;
    draw_line(img, at, double(top), at, double(top) + ph, kGrey);
    const std::string label = tick_label(v);
    const int64_t x = std::min(int64_t(at) - 10, W - 2 - text_width(label));  // the last stays inside
    draw_text(img, label, x, int64_t(double(top) + ph) + 6, kBlack);
  }
  draw_line(img, double(left), double(top) + ph, double(W - right), double(top) + ph, kBlack);
  draw_line(img, double(left), double(top), double(left), double(top) + ph, kBlack);
  draw_text(img, x_label + (log_x ? " (log scale)" : ""), left + int64_t(pw / 2) - 40, int64_t(double(top) + ph) + 20,
            kBlack);
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    check(s.y.size() == x.size(), "line_chart: series '", s.label, "' has ", s.y.size(), " values for ", x.size(), " x");
    for (size_t i = 1; i < x.size(); ++i)
      if (std::isfinite(s.y[i - 1]) && std::isfinite(s.y[i]))
        draw_line(img, px(x[i - 1]), py(std::clamp(s.y[i - 1], lo, hi)), px(x[i]), py(std::clamp(s.y[i], lo, hi)),
                  s.colour);
    const int64_t ly = int64_t(double(top) + ph) + 36 + 14 * int64_t(k);
    draw_line(img, double(left), double(ly + 3), double(left + 20), double(ly + 3), s.colour);
    draw_text(img, s.label, left + 26, ly, kBlack);
  }
  return img;
}

}  // namespace

Image matrix_heatmap(const std::string& title, const std::vector<double>& values, int64_t rows, int64_t cols,
                     const std::vector<std::string>& labels, double scale, int64_t cell) {
  check(int64_t(values.size()) == rows * cols, "matrix_heatmap: ", values.size(), " values for ", rows, "×", cols);
  const int64_t left = 70, top = 34;
  Image img(left + cols * cell + 20, top + rows * cell + 56);
  draw_text(img, title, 8, 8, kBlack, 2);
  draw_text(img, cat("colour: blue -", scale, " / white 0 / red +", scale), left, top + rows * cell + 36, kBlack);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const Rgb colour = diverging_colour(float(values[size_t(r * cols + c)]), float(scale));
      for (int64_t y = 0; y < cell; ++y)
        for (int64_t x = 0; x < cell; ++x) img.set(left + c * cell + x, top + r * cell + y, colour);
    }
  // Labels at up to eight evenly spaced rows and columns.
  const int64_t every = std::max<int64_t>(1, (rows + 7) / 8);
  for (int64_t i = 0; i < rows && i < int64_t(labels.size()); i += every) {
    draw_text(img, labels[size_t(i)], 4, top + i * cell + cell / 2 - 3, kBlack);
    draw_text(img, labels[size_t(i)], left + i * cell, top + rows * cell + 6 + (i / every % 2) * 12, kBlack);
  }
  return img;
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
  const int64_t gap = 6, cell_h = 28;
  const std::string axes = cat("rows: ", row_axis, "; columns: ", column_axis);
  int64_t left = 2 * gap, cell_w = 44;
  for (const std::string& l : row_labels) left = std::max(left, text_width(l) + 2 * gap);
  for (const std::string& l : column_labels) cell_w = std::max(cell_w, text_width(l) + gap);
  const int64_t top = 34 + 2 * (text_height() + 4);
  const int64_t width = std::max({left + cols * cell_w + gap, text_width(title, 2) + 2 * gap, text_width(axes) + 2 * gap});
  Image img(width, top + rows * cell_h + text_height() + 3 * gap);
  draw_text(img, title, gap, 8, kBlack, 2);
  draw_text(img, axes, gap, 34, kBlack);
  for (int64_t c = 0; c < cols; ++c) draw_text(img, column_labels[size_t(c)], left + c * cell_w + 2, top - text_height() - 4, kBlack);
  for (int64_t r = 0; r < rows; ++r) {
    draw_text(img, row_labels[size_t(r)], gap, top + r * cell_h + cell_h / 2 - text_height() / 2, kBlack);
    for (int64_t c = 0; c < cols; ++c) {
      const double v = values[size_t(r * cols + c)];
      const bool known = std::isfinite(v);
      const Rgb colour = known ? diverging_colour(float(std::clamp((v - lo) / (hi - lo), 0.0, 1.0)), 1.0f) : kGrey;
      const int64_t x0 = left + c * cell_w, y0 = top + r * cell_h;
      for (int64_t y = 1; y < cell_h; ++y)
        for (int64_t x = 1; x < cell_w; ++x) img.set(x0 + x, y0 + y, colour);
      char text[32];
      std::snprintf(text, sizeof text, known ? "%.2f" : "-", v);
      draw_text(img, text, x0 + (cell_w - text_width(text)) / 2, y0 + cell_h / 2 - text_height() / 2, kBlack);
    }
  }
  draw_text(img, cat("colour: white ", lo, " to red ", hi, "; grey: not measured"), gap, top + rows * cell_h + gap, kBlack);
  return img;
}

}  // namespace adjoint
