#include "analysis/common/heatmap.h"

#include <algorithm>
#include <cmath>

#include "analysis/common/figure.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/png.h"

// stb_easy_font is a header of static functions; the ones we do not call would warn.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb/stb_easy_font.h>
#pragma GCC diagnostic pop

namespace adjoint {

namespace {

uint8_t to_byte(double unit) { return static_cast<uint8_t>(std::lround(std::clamp(unit, 0.0, 1.0) * 255.0)); }

// The (C, H, W) shape of one example's map or input, checked.
void check_image(const Tensor& t, const char* who) {
  check(t.defined() && t.dim() == 3, who, ": expects one image (C, H, W), got ",
        t.defined() ? to_string(t.shape()) : std::string("undefined"));
}

double max_abs(const std::vector<float>& values) {
  double m = 0;
  for (float v : values)
    if (std::isfinite(v)) m = std::max(m, double(std::fabs(v)));
  return m;
}

// Grey levels in [0, 1] of a de-normalised input: the mean over channels.
std::vector<double> grey_levels(const Tensor& x, const Normalisation& norm) {
  const Tensor xc = x.contiguous();
  const int64_t C = x.size(0), HW = x.size(1) * x.size(2);
  std::vector<double> grey(size_t(HW), 0.0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < HW; ++i)
      grey[size_t(i)] += std::clamp(double(norm.denormalise(xc.data()[c * HW + i], c)), 0.0, 1.0) / double(C);
  return grey;
}

// An H×W picture, each source pixel drawn as a scale×scale block.
template <class PixelColour>
Image enlarged(int64_t height, int64_t width, int64_t scale, PixelColour colour_of) {
  check(scale >= 1, "heat-map: the scale must be at least 1, got ", scale);
  Image out(width * scale, height * scale);
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      const Rgb c = colour_of(y * width + x);
      for (int64_t dy = 0; dy < scale; ++dy)
        for (int64_t dx = 0; dx < scale; ++dx) out.set(x * scale + dx, y * scale + dy, c);
    }
  return out;
}

}  // namespace

Rgb diverging_colour(float value, float max_abs_value) {
  if (!(max_abs_value > 0) || !std::isfinite(max_abs_value) || !std::isfinite(value)) return {255, 255, 255};
  const double t = std::clamp(double(value) / double(max_abs_value), -1.0, 1.0);
  const uint8_t fade = to_byte(1.0 - std::fabs(t));  // the two other channels fade from white
  if (t >= 0) return {255, fade, fade};
  return {fade, fade, 255};
}

Image::Image(int64_t w, int64_t h, Rgb fill) : width(w), height(h), pixels(size_t(w * h * 3)) {
  check(w >= 0 && h >= 0, "Image: bad size ", w, "x", h);
  for (int64_t i = 0; i < w * h; ++i) {
    pixels[size_t(3 * i)] = fill.r;
    pixels[size_t(3 * i + 1)] = fill.g;
    pixels[size_t(3 * i + 2)] = fill.b;
  }
}

Rgb Image::at(int64_t x, int64_t y) const {
  check(x >= 0 && x < width && y >= 0 && y < height, "Image: pixel (", x, ", ", y, ") outside ", width, "x", height);
  const size_t i = size_t(3 * (y * width + x));
  return {pixels[i], pixels[i + 1], pixels[i + 2]};
}

void Image::set(int64_t x, int64_t y, Rgb c) {
  if (x < 0 || x >= width || y < 0 || y >= height) return;  // drawing is clipped at the borders
  const size_t i = size_t(3 * (y * width + x));
  pixels[i] = c.r;
  pixels[i + 1] = c.g;
  pixels[i + 2] = c.b;
}

float Normalisation::denormalise(float value, int64_t channel) const {
  const float m = mean.empty() ? 0.0f : mean[size_t(channel) % mean.size()];
  const float s = std.empty() ? 1.0f : std[size_t(channel) % std.size()];
  return value * s + m;
}

int64_t default_scale(int64_t height, int64_t width) {
  const int64_t side = std::max<int64_t>(1, std::max(height, width));
  return std::clamp<int64_t>(224 / side, 1, 8);
}

std::vector<float> channel_sum(const Tensor& map) {
  check_image(map, "channel_sum");
  const Tensor m = map.contiguous();
  const int64_t C = m.size(0), HW = m.size(1) * m.size(2);
  std::vector<float> out(size_t(HW), 0.0f);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < HW; ++i) out[size_t(i)] += m.data()[c * HW + i];
  return out;
}

Image render_heatmap(const Tensor& map, int64_t scale) {
  check_image(map, "render_heatmap");
  const std::vector<float> v = channel_sum(map);
  const float scale_max = float(max_abs(v));
  return enlarged(map.size(1), map.size(2), scale, [&](int64_t i) { return diverging_colour(v[size_t(i)], scale_max); });
}

Image render_input(const Tensor& x, const Normalisation& norm, int64_t scale) {
  check_image(x, "render_input");
  const Tensor xc = x.contiguous();
  const int64_t C = x.size(0), HW = x.size(1) * x.size(2);
  if (C != 3) {
    const std::vector<double> grey = grey_levels(x, norm);
    return enlarged(x.size(1), x.size(2), scale, [&](int64_t i) {
      const uint8_t g = to_byte(grey[size_t(i)]);
      return Rgb{g, g, g};
    });
  }
  return enlarged(x.size(1), x.size(2), scale, [&](int64_t i) {
    const auto channel = [&](int64_t c) { return to_byte(norm.denormalise(xc.data()[c * HW + i], c)); };
    return Rgb{channel(0), channel(1), channel(2)};
  });
}

Image render_overlay(const Tensor& x, const Tensor& map, const Normalisation& norm, int64_t scale) {
  check_image(x, "render_overlay");
  check_image(map, "render_overlay");
  check(x.size(1) == map.size(1) && x.size(2) == map.size(2), "render_overlay: the map ", map.shape(),
        " does not cover the input ", x.shape());
  const std::vector<double> grey = grey_levels(x, norm);
  const std::vector<float> v = channel_sum(map);
  const double scale_max = max_abs(v);
  return enlarged(x.size(1), x.size(2), scale, [&](int64_t i) {
    const double g = grey[size_t(i)];
    const float value = v[size_t(i)];
    const double strength = scale_max > 0 && std::isfinite(value) ? std::min(1.0, std::fabs(value) / scale_max) : 0.0;
    const double alpha = 0.85 * std::sqrt(strength);
    const Rgb c = diverging_colour(value, float(scale_max));
    const auto blend = [&](uint8_t channel) { return to_byte((1 - alpha) * g + alpha * channel / 255.0); };
    return Rgb{blend(c.r), blend(c.g), blend(c.b)};
  });
}

namespace {

// stb_easy_font indexes its glyph table by (byte − 32): every byte it has no glyph for
// (control bytes, and each byte of a UTF-8 character such as ± or ×) is drawn as '?', one
// glyph a byte, rather than read from outside the table.
std::string easy_font_text(const std::string& text) {
  std::string copy = text;
  for (char& c : copy)
    if (c != '\n' && (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126)) c = '?';
  return copy;
}

}  // namespace

int64_t text_width(const std::string& text, int64_t size) {
  std::string copy = easy_font_text(text);
  return stb_easy_font_width(copy.data()) * size;
}

int64_t text_height(int64_t size) {
  char sample[] = "Ag";
  return stb_easy_font_height(sample) * size;
}

void draw_text(Image& image, const std::string& text, int64_t x, int64_t y, Rgb colour, int64_t size) {
  std::string copy = easy_font_text(text);
  // stb_easy_font emits axis-aligned quads of 4 vertices (x, y, z floats + 4 colour bytes).
  struct Vertex {
    float x, y, z;
    unsigned char rgba[4];
  };
  std::vector<Vertex> vertices(copy.size() * 80 + 16);
  const int quads = stb_easy_font_print(0, 0, copy.data(), nullptr, vertices.data(),
                                        int(vertices.size() * sizeof(Vertex)));
  for (int q = 0; q < quads; ++q) {
    const Vertex* v = &vertices[size_t(4 * q)];
    const int64_t x0 = int64_t(std::lround(v[0].x)), y0 = int64_t(std::lround(v[0].y));
    const int64_t x1 = int64_t(std::lround(v[2].x)), y1 = int64_t(std::lround(v[2].y));
    for (int64_t py = y0 * size; py < y1 * size; ++py)
      for (int64_t px = x0 * size; px < x1 * size; ++px) image.set(x + px, y + py, colour);
  }
}

Image contact_sheet(const std::vector<SheetColumn>& columns) { return Figure(ImageGrid{"", columns}).pixels(); }

std::string encode_png(const Image& image) {
  check(image.width > 0 && image.height > 0, "encode_png: empty image ", image.width, "x", image.height);
  return encode_png_rgb(image.pixels.data(), image.width, image.height);
}

void write_png(const std::string& path, const Image& image) {
  AtomicFile file(path, "write_png");
  file.write(encode_png(image));
  file.commit();
}

}  // namespace adjoint
