#include "analysis/common/figure.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "engine/error.h"
#include "engine/io/files.h"

namespace adjoint {

const Rgb kSeriesColours[8] = {{31, 119, 180}, {214, 39, 40},  {44, 160, 44},  {255, 127, 14},
                               {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127}};

namespace {

constexpr const char* kFont = "DejaVu Sans";
constexpr double kTitleSize = 15, kLabelSize = 12.5, kTickSize = 11;
const Rgb kInk{0, 0, 0}, kGrid{225, 225, 225}, kMissing{200, 200, 200};

using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using ContextPtr = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

void set_colour(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0); }

// Cairo and fontconfig keep their font caches for the life of the process. They are
// released at exit so that a leak checker (the sanitizer build) sees nothing left: the
// release is registered before the first font or the scratch surface exists, so it runs
// after every cairo object is gone, as cairo_debug_reset_static_data requires.
void release_font_caches() {
  cairo_debug_reset_static_data();
  FcFini();
}
void release_font_caches_at_exit() {
  static const bool registered = std::atexit(release_font_caches) == 0;
  (void)registered;
}

void set_font(cairo_t* cr, double size, bool bold) {
  release_font_caches_at_exit();
  cairo_select_font_face(cr, kFont, CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

// The width of `text` in pixels, measured on a scratch surface (to lay a figure out before drawing it).
double text_extent(const std::string& text, double size, bool bold = false) {
  release_font_caches_at_exit();  // before `scratch`, so it runs after scratch is destroyed
  static const SurfacePtr scratch(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1), cairo_surface_destroy);
  const ContextPtr cr(cairo_create(scratch.get()), cairo_destroy);
  set_font(cr.get(), size, bold);
  cairo_text_extents_t e;
  cairo_text_extents(cr.get(), text.c_str(), &e);
  return e.x_advance;
}

double widest(const std::vector<std::string>& texts, double size) {
  double w = 0;
  for (const std::string& t : texts) w = std::max(w, text_extent(t, size));
  return w;
}

// Text with its anchor at (x, y): `align` 0 left, 0.5 centre, 1 right; y is the middle of
// the text's x-height; `angle` in radians turns it about the anchor.
void draw_text(cairo_t* cr, const std::string& text, double x, double y, double size, double align = 0,
               bool bold = false, double angle = 0, Rgb colour = kInk) {
  set_colour(cr, colour);
  set_font(cr, size, bold);
  cairo_text_extents_t e;
  cairo_text_extents(cr, text.c_str(), &e);
  cairo_save(cr);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  cairo_move_to(cr, -align * e.x_advance, 0.36 * size);
  cairo_show_text(cr, text.c_str());
  cairo_restore(cr);
}

void line(cairo_t* cr, double x0, double y0, double x1, double y1, Rgb colour, double width) {
  set_colour(cr, colour);
  cairo_set_line_width(cr, width);
  cairo_move_to(cr, x0, y0);
  cairo_line_to(cr, x1, y1);
  cairo_stroke(cr);
}

void fill_rect(cairo_t* cr, double x, double y, double w, double h, Rgb colour) {
  set_colour(cr, colour);
  cairo_rectangle(cr, x, y, w, h);
  cairo_fill(cr);
}

void white_page(cairo_t* cr) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
}

// The labels of an axis with `n` entries: the ones given, else the indices.
std::vector<std::string> axis_labels(const std::vector<std::string>& given, int64_t n, const char* what) {
  if (given.empty()) {
    std::vector<std::string> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(std::to_string(i));
    return out;
  }
  check(int64_t(given.size()) == n, "heat-map: ", given.size(), " ", what, " labels for ", n, " ", what, "s");
  return given;
}

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

// The figure drawn on a fresh RGB image surface.
SurfacePtr raster(int64_t width, int64_t height, const std::function<void(cairo_t*)>& draw) {
  SurfacePtr surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, int(width), int(height)), cairo_surface_destroy);
  check(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "figure: cannot make a ", width, "x", height,
        " image: ", cairo_status_to_string(cairo_surface_status(surface.get())));
  const ContextPtr cr(cairo_create(surface.get()), cairo_destroy);
  draw(cr.get());
  cairo_surface_flush(surface.get());
  return surface;
}

// An Image as a Cairo surface (for a grid of images), its pixels exactly as they are.
SurfacePtr image_surface(const Image& image) {
  SurfacePtr s(cairo_image_surface_create(CAIRO_FORMAT_RGB24, int(image.width), int(image.height)), cairo_surface_destroy);
  cairo_surface_flush(s.get());
  unsigned char* data = cairo_image_surface_get_data(s.get());
  const int stride = cairo_image_surface_get_stride(s.get());
  for (int64_t y = 0; y < image.height; ++y)
    for (int64_t x = 0; x < image.width; ++x) {
      const Rgb c = image.at(x, y);
      const uint32_t pixel = (uint32_t(c.r) << 16) | (uint32_t(c.g) << 8) | uint32_t(c.b);
      std::memcpy(data + y * stride + 4 * x, &pixel, 4);
    }
  cairo_surface_mark_dirty(s.get());
  return s;
}

// The drawing of a line chart; sets its size.
std::function<void(cairo_t*)> line_chart_drawing(const LineChart& c, int64_t& width, int64_t& height) {
  for (const LineSeries& s : c.series)
    check(s.y.size() == c.x.size(), "line chart '", c.title, "': series '", s.label, "' has ", s.y.size(),
          " values for ", c.x.size(), " x values");
  check(!c.x.empty(), "line chart '", c.title, "': no x values");
  if (c.log_x)
    for (double v : c.x) check(v > 0, "line chart '", c.title, "': a log x axis needs x > 0, got ", v);
  const auto fx = [log_x = c.log_x](double v) { return log_x ? std::log10(v) : v; };
  double x_lo = fx(c.x.front()), x_hi = x_lo;
  for (double v : c.x) x_lo = std::min(x_lo, fx(v)), x_hi = std::max(x_hi, fx(v));
  if (!(x_hi > x_lo)) x_lo -= 0.5, x_hi += 0.5;
  std::vector<double> all;
  for (const LineSeries& s : c.series) all.insert(all.end(), s.y.begin(), s.y.end());
  auto [y_lo, y_hi] = data_range(all);
  std::tie(y_lo, y_hi) = nice_range(y_lo, y_hi);
  if (std::isfinite(c.y_min)) y_lo = c.y_min;
  if (std::isfinite(c.y_max)) y_hi = c.y_max;
  check(y_hi > y_lo, "line chart '", c.title, "': the y range [", y_lo, ", ", y_hi, "] is empty");

  const std::vector<double> y_ticks = nice_ticks(y_lo, y_hi);
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : y_hi - y_lo;
  // x ticks: powers of ten on a log axis (when two fit), else round values.
  std::vector<double> x_ticks;  // in axis units (log10 x on a log axis)
  double x_step = 0;
  if (c.log_x)
    for (double k = std::ceil(x_lo); k <= x_hi + 1e-9; ++k) x_ticks.push_back(k);
  if (x_ticks.size() < 2) {
    x_ticks = nice_ticks(x_lo, x_hi);
    x_step = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : x_hi - x_lo;
  }
  const auto x_tick_text = [=](double t) {
    return c.log_x && x_step == 0 ? tick_label(std::pow(10.0, t), std::pow(10.0, t)) : tick_label(t, x_step);
  };
  std::vector<std::string> y_texts;
  for (double t : y_ticks) y_texts.push_back(tick_label(t, y_step));

  const double left = 28 + widest(y_texts, kTickSize) + 10, right = 28, top = 44, plot_h = 300;
  const double legend_h = 20.0 * double(c.series.size());
  width = int64_t(std::max(660.0, text_extent(c.title, kTitleSize, true) + 24));
  height = int64_t(top + plot_h + 56 + legend_h + 8);
  const double plot_w = double(width) - left - right;
  const auto px = [=](double v) { return left + (fx(v) - x_lo) / (x_hi - x_lo) * plot_w; };
  const auto py = [=](double v) { return top + (y_hi - v) / (y_hi - y_lo) * plot_h; };

  return [=](cairo_t* cr) {
    white_page(cr);
    draw_text(cr, c.title, double(width) / 2, 20, kTitleSize, 0.5, true);
    for (size_t i = 0; i < y_ticks.size(); ++i) {
      line(cr, left, py(y_ticks[i]), left + plot_w, py(y_ticks[i]), kGrid, 1);
      line(cr, left - 5, py(y_ticks[i]), left, py(y_ticks[i]), kInk, 1);
      draw_text(cr, y_texts[i], left - 8, py(y_ticks[i]), kTickSize, 1);
    }
    for (double t : x_ticks) {
      const double at = left + (t - x_lo) / (x_hi - x_lo) * plot_w;
      line(cr, at, top, at, top + plot_h, kGrid, 1);
      line(cr, at, top + plot_h, at, top + plot_h + 5, kInk, 1);
      draw_text(cr, x_tick_text(t), at, top + plot_h + 16, kTickSize, 0.5);
    }
    cairo_rectangle(cr, left, top, plot_w, plot_h);
    set_colour(cr, kInk);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    draw_text(cr, c.x_label + (c.log_x ? " (log scale)" : ""), left + plot_w / 2, top + plot_h + 38, kLabelSize, 0.5);
    draw_text(cr, c.y_label, 14, top + plot_h / 2, kLabelSize, 0.5, false, -M_PI / 2);
    cairo_save(cr);
    cairo_rectangle(cr, left - 4, top - 4, plot_w + 8, plot_h + 8);  // a dot on the frame shows whole
    cairo_clip(cr);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    for (const LineSeries& s : c.series) {
      set_colour(cr, s.colour);
      cairo_set_line_width(cr, 2);
      bool drawing = false;
      for (size_t i = 0; i < c.x.size(); ++i) {
        if (!std::isfinite(s.y[i])) {
          drawing = false;
          continue;
        }
        const bool alone = (i == 0 || !std::isfinite(s.y[i - 1])) && (i + 1 == c.x.size() || !std::isfinite(s.y[i + 1]));
        if (alone) {  // a point with no neighbour: a dot, so that it shows
          cairo_stroke(cr);
          cairo_arc(cr, px(c.x[i]), py(s.y[i]), 3, 0, 2 * M_PI);
          cairo_fill(cr);
          drawing = false;
          continue;
        }
        if (drawing)
          cairo_line_to(cr, px(c.x[i]), py(s.y[i]));
        else
          cairo_move_to(cr, px(c.x[i]), py(s.y[i]));
        drawing = true;
      }
      cairo_stroke(cr);
    }
    cairo_restore(cr);
    for (size_t k = 0; k < c.series.size(); ++k) {
      const double y = top + plot_h + 60 + 20.0 * double(k);
      line(cr, left, y, left + 26, y, c.series[k].colour, 3);
      draw_text(cr, c.series[k].label, left + 34, y, kLabelSize);
    }
  };
}

// The drawing of a heat-map with its colour bar; sets its size.
std::function<void(cairo_t*)> heat_map_drawing(const HeatMap& m, int64_t& width, int64_t& height) {
  check(m.rows > 0 && m.cols > 0 && int64_t(m.values.size()) == m.rows * m.cols, "heat-map '", m.title, "': ",
        m.values.size(), " values for ", m.rows, "x", m.cols);
  check(m.hi > m.lo && std::isfinite(m.lo) && std::isfinite(m.hi), "heat-map '", m.title, "': the colour range [",
        m.lo, ", ", m.hi, "] is empty");
  const std::vector<std::string> row_labels = axis_labels(m.row_labels, m.rows, "row");
  const std::vector<std::string> col_labels = axis_labels(m.col_labels, m.cols, "column");
  const double cell = std::clamp(std::floor(440.0 / double(std::max(m.rows, m.cols))), 4.0, 60.0);
  const bool print_values = m.print_values && cell >= 34;
  // At most about 40 labels along an axis.
  const int64_t row_every = std::max<int64_t>(1, (m.rows + 39) / 40), col_every = std::max<int64_t>(1, (m.cols + 39) / 40);
  const double label_size = std::min(kTickSize, std::max(7.0, cell * 0.8));
  const double row_label_w = widest(row_labels, label_size), col_label_w = widest(col_labels, label_size);
  const bool upright_columns = col_label_w <= cell * double(col_every) - 4;
  const double col_label_h = upright_columns ? 18 : col_label_w + 10;
  bool any_missing = false;
  for (double v : m.values) any_missing = any_missing || !std::isfinite(v);
  const std::string note = m.range_note + (any_missing ? (m.range_note.empty() ? "" : "; ") + std::string("grey: not measured") : "");

  const std::vector<double> bar_ticks = nice_ticks(m.lo, m.hi);
  const double bar_step = bar_ticks.size() > 1 ? bar_ticks[1] - bar_ticks[0] : m.hi - m.lo;
  std::vector<std::string> bar_texts;
  for (double t : bar_ticks) bar_texts.push_back(tick_label(t, bar_step));

  const double left = 30 + row_label_w + 8, top = 44;
  const double grid_w = cell * double(m.cols), grid_h = cell * double(m.rows);
  const double bar_x = left + grid_w + 24, bar_w = 18, bar_h = std::clamp(grid_h, 140.0, 420.0);
  const double right_edge = bar_x + bar_w + 8 + widest(bar_texts, kTickSize) + 16;
  width = int64_t(std::ceil(std::max({right_edge, text_extent(m.title, kTitleSize, true) + 24,
                                      text_extent(note, kTickSize) + 24, left + grid_w / 2 + text_extent(m.x_label, kLabelSize) / 2 + 12})));
  // The rotated y label fits beside the grid and the bar, or the figure grows to hold it.
  const double y_label_h = text_extent(m.y_label, kLabelSize) + 8;
  const double body_h = std::max({grid_h, bar_h, y_label_h});
  const double below_grid = top + body_h;
  height = int64_t(std::ceil(std::max(top + grid_h + col_label_h, below_grid) + 26 + (note.empty() ? 0 : 22) + 8));

  return [=](cairo_t* cr) {
    white_page(cr);
    draw_text(cr, m.title, double(width) / 2, 20, kTitleSize, 0.5, true);
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);  // cells meet without seams
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) {
        const double v = m.values[size_t(r * m.cols + c)];
        fill_rect(cr, left + cell * double(c), top + cell * double(r), cell, cell,
                  std::isfinite(v) ? scale_colour(v, m.lo, m.hi, m.scale) : kMissing);
      }
    for (int64_t i = 0; i < 64; ++i) {  // the colour bar, hi at the top
      const double v = m.hi - (m.hi - m.lo) * (double(i) + 0.5) / 64;
      fill_rect(cr, bar_x, top + bar_h * double(i) / 64, bar_w, bar_h / 64 + 1, scale_colour(v, m.lo, m.hi, m.scale));
    }
    cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
    set_colour(cr, kInk);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, bar_x, top, bar_w, bar_h);
    cairo_stroke(cr);
    for (size_t i = 0; i < bar_ticks.size(); ++i) {
      const double y = top + (m.hi - bar_ticks[i]) / (m.hi - m.lo) * bar_h;
      line(cr, bar_x + bar_w, y, bar_x + bar_w + 5, y, kInk, 1);
      draw_text(cr, bar_texts[i], bar_x + bar_w + 8, y, kTickSize);
    }
    if (print_values)
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) {
          const double v = m.values[size_t(r * m.cols + c)];
          char text[32];
          std::snprintf(text, sizeof text, std::isfinite(v) ? "%.2f" : "-", v);
          draw_text(cr, text, left + cell * (double(c) + 0.5), top + cell * (double(r) + 0.5), 10.5, 0.5);
        }
    for (int64_t r = 0; r < m.rows; r += row_every)
      draw_text(cr, row_labels[size_t(r)], left - 6, top + cell * (double(r) + 0.5), label_size, 1);
    for (int64_t c = 0; c < m.cols; c += col_every) {
      const double x = left + cell * (double(c) + 0.5);
      if (upright_columns)
        draw_text(cr, col_labels[size_t(c)], x, top + grid_h + 10, label_size, 0.5);
      else
        draw_text(cr, col_labels[size_t(c)], x, top + grid_h + 6, label_size, 1, false, -M_PI / 2);
    }
    draw_text(cr, m.y_label, 14, top + std::max(grid_h, y_label_h) / 2, kLabelSize, 0.5, false, -M_PI / 2);
    const double x_label_y = std::max(top + grid_h + col_label_h, below_grid) + 14;
    draw_text(cr, m.x_label, left + grid_w / 2, x_label_y, kLabelSize, 0.5);
    if (!note.empty()) draw_text(cr, note, 12, x_label_y + 22, kTickSize);
  };
}

// The drawing of a grid of images; sets its size.
std::function<void(cairo_t*)> image_grid_drawing(const ImageGrid& g, int64_t& width, int64_t& height) {
  constexpr double gap = 8, label_h = 20, caption_h = 16;
  const double top = g.title.empty() ? 0 : 40;
  size_t rows = 0;
  for (const SheetColumn& c : g.columns) rows = std::max(rows, c.cells.size());
  check(rows > 0, "image grid '", g.title, "': no images");
  std::vector<double> col_w(g.columns.size(), 0), row_h(rows, 0);
  for (size_t c = 0; c < g.columns.size(); ++c) {
    col_w[c] = text_extent(g.columns[c].label, kTickSize);
    for (size_t r = 0; r < g.columns[c].cells.size(); ++r) {
      const SheetCell& cell = g.columns[c].cells[r];
      col_w[c] = std::max({col_w[c], double(cell.image.width), text_extent(cell.caption, kTickSize)});
      row_h[r] = std::max(row_h[r], double(cell.image.height));
    }
  }
  double w = gap, h = top + label_h;
  for (double cw : col_w) w += cw + gap;
  for (double rh : row_h) h += rh + caption_h + gap;
  width = int64_t(std::ceil(std::max(w, text_extent(g.title, kTitleSize, true) + 24)));
  height = int64_t(std::ceil(h));
  return [=](cairo_t* cr) {
    white_page(cr);
    if (!g.title.empty()) draw_text(cr, g.title, double(width) / 2, 20, kTitleSize, 0.5, true);
    double x = std::round((double(width) - w) / 2) + gap;  // the grid centred under a wider title
    for (size_t c = 0; c < g.columns.size(); ++c) {
      draw_text(cr, g.columns[c].label, x + col_w[c] / 2, top + 6, kTickSize, 0.5, true);
      double y = top + label_h;
      for (size_t r = 0; r < rows; ++r) {
        if (r < g.columns[c].cells.size() && g.columns[c].cells[r].image.width > 0) {
          const SheetCell& cell = g.columns[c].cells[r];
          const SurfacePtr picture = image_surface(cell.image);
          const double ix = std::round(x + (col_w[c] - double(cell.image.width)) / 2);  // whole pixels: no blur
          cairo_set_source_surface(cr, picture.get(), ix, y);
          cairo_pattern_set_filter(cairo_get_source(cr), CAIRO_FILTER_NEAREST);  // data pixels stay sharp
          cairo_rectangle(cr, ix, y, double(cell.image.width), double(cell.image.height));
          cairo_fill(cr);
          draw_text(cr, cell.caption, x + col_w[c] / 2, y + double(cell.image.height) + 9, kTickSize, 0.5);
        }
        y += row_h[r] + caption_h + gap;
      }
      x += col_w[c] + gap;
    }
  };
}

}  // namespace

std::pair<double, double> data_range(const std::vector<double>& values) {
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) return {0.0, 1.0};
  if (!(hi > lo)) return {lo - 0.5, hi + 0.5};
  return {lo, hi};
}

namespace {

// The round step (1, 2 or 5 × 10^k) that cuts [lo, hi] into about `target` parts.
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target - 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  const double nice = fraction < 1.5 ? 1 : fraction < 3.5 ? 2 : fraction < 7.5 ? 5 : 10;
  return nice * magnitude;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  check(std::isfinite(lo) && std::isfinite(hi) && hi > lo, "nice_ticks: bad range [", lo, ", ", hi, "]");
  const double step = nice_step(lo, hi, target);
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; ++k)
    ticks.push_back(std::abs(k) < 1e-9 ? 0.0 : k * step);  // no "-0"
  return ticks;
}

std::pair<double, double> nice_range(double lo, double hi, int target) {
  const double step = nice_step(lo, hi, target);
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step};
}

std::string tick_label(double value, double step) {
  char text[32];
  const double size = std::max(std::abs(value), std::abs(step));
  if (size >= 1e6 || (size > 0 && size < 1e-4)) {
    std::snprintf(text, sizeof text, "%.3g", value);
  } else {
    const int decimals = step > 0 ? std::clamp(int(-std::floor(std::log10(step) + 1e-9)), 0, 6) : 2;
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
  }
  return text;
}

Rgb scale_colour(double value, double lo, double hi, ColourScale scale) {
  if (scale == ColourScale::Diverging) {
    const double mid = (lo + hi) / 2, half = (hi - lo) / 2;
    return diverging_colour(float(value - mid), float(half));
  }
  return diverging_colour(float(std::clamp((value - lo) / (hi - lo), 0.0, 1.0)), 1.0f);
}

Figure::Figure(const LineChart& chart) : draw_(line_chart_drawing(chart, width_, height_)) {}
Figure::Figure(const HeatMap& map) : draw_(heat_map_drawing(map, width_, height_)) {}
Figure::Figure(const ImageGrid& grid) : draw_(image_grid_drawing(grid, width_, height_)) {}

Image Figure::pixels() const {
  const SurfacePtr surface = raster(width_, height_, draw_);
  Image out(width_, height_);
  const unsigned char* data = cairo_image_surface_get_data(surface.get());
  const int stride = cairo_image_surface_get_stride(surface.get());
  for (int64_t y = 0; y < height_; ++y)
    for (int64_t x = 0; x < width_; ++x) {
      uint32_t pixel;
      std::memcpy(&pixel, data + y * stride + 4 * x, 4);
      out.set(x, y, Rgb{uint8_t(pixel >> 16), uint8_t(pixel >> 8), uint8_t(pixel)});
    }
  return out;
}

std::string Figure::png() const {
  const SurfacePtr surface = raster(width_, height_, draw_);
  std::string bytes;
  const cairo_status_t status = cairo_surface_write_to_png_stream(surface.get(), append_bytes, &bytes);
  check(status == CAIRO_STATUS_SUCCESS, "figure: PNG encoding failed: ", cairo_status_to_string(status));
  return bytes;
}

namespace {

// Cairo names an SVG's surfaces ("surface362") from a counter over every surface the process
// made before, so the same figure drawn later in a process would differ in its bytes: the
// names are renumbered 1, 2, … in the order they first appear in the document.
std::string number_surfaces_in_order(const std::string& svg) {
  static const std::string kName = "surface";
  std::map<std::string, std::string> renamed;
  std::string out;
  size_t copied = 0;
  for (size_t at = svg.find(kName); at != std::string::npos; at = svg.find(kName, at + kName.size())) {
    size_t end = at + kName.size();
    while (end < svg.size() && std::isdigit(static_cast<unsigned char>(svg[end]))) ++end;
    const bool a_name = end > at + kName.size() && at > 0 && (svg[at - 1] == '"' || svg[at - 1] == '#');
    if (!a_name) continue;
    const std::string number = svg.substr(at + kName.size(), end - at - kName.size());
    const auto entry = renamed.emplace(number, std::to_string(renamed.size() + 1)).first;
    out.append(svg, copied, at + kName.size() - copied);
    out += entry->second;
    copied = end;
  }
  out.append(svg, copied, std::string::npos);
  return out;
}

}  // namespace

std::string Figure::svg() const {
  std::string text;
  {
    const SurfacePtr surface(cairo_svg_surface_create_for_stream(append_bytes, &text, double(width_), double(height_)),
                             cairo_surface_destroy);
    check(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "figure: cannot make an SVG surface");
    const ContextPtr cr(cairo_create(surface.get()), cairo_destroy);
    draw_(cr.get());
    cairo_surface_finish(surface.get());
    check(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "figure: SVG drawing failed: ",
          cairo_status_to_string(cairo_surface_status(surface.get())));
  }
  return number_surfaces_in_order(text);
}

void Figure::write(const std::string& stem) const {
  write_file_atomic(stem + ".png", png());
  write_file_atomic(stem + ".svg", svg());
}

}  // namespace adjoint
