// Pictures of explanations: attribution maps as diverging heat-maps, overlays on the
// input, counterfactual images and contact sheets, written as PNG files.
//
// A map (C, H, W) is summed over its channels first (the signed evidence per pixel), then
// shown on a symmetric scale ±max|map|: blue for negative, white for zero, red for
// positive, so that the colour of zero never depends on the map. Small images are
// enlarged by an integer factor with nearest-neighbour sampling so that single pixels
// stay visible (a 28×28 map becomes 224×224).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

// The diverging blue–white–red colour of `value` on the scale [−max_abs, max_abs]:
// 0 → white, +max_abs → pure red, −max_abs → pure blue, linear in between, clamped
// outside. A zero (or non-finite) scale gives white.
Rgb diverging_colour(float value, float max_abs);

// An 8-bit RGB picture, row-major, three bytes per pixel.
struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;
  Image() = default;
  Image(int64_t width, int64_t height, Rgb fill = {255, 255, 255});
  Rgb at(int64_t x, int64_t y) const;
  void set(int64_t x, int64_t y, Rgb colour);
};

// The per-channel normalisation of the model's inputs, to show them as they were before
// it: pixel = x·std[c] + mean[c]. Empty vectors: the inputs are shown as they are. One
// value serves every channel.
struct Normalisation {
  std::vector<float> mean, std;
  float denormalise(float value, int64_t channel) const;
};

// The enlargement for an H×W image: the largest integer ≤ 224 / max(H, W), in [1, 8].
int64_t default_scale(int64_t height, int64_t width);

// A map (C, H, W) summed over channels: H·W values, row-major.
std::vector<float> channel_sum(const Tensor& map);

// The heat-map of a map (C, H, W) on its own scale ±max|Σ_c map|, enlarged `scale` times.
Image render_heatmap(const Tensor& map, int64_t scale);
// The input (C, H, W) de-normalised and clamped to [0, 1]: grey for one channel, RGB for
// three (other channel counts show the mean of the channels).
Image render_input(const Tensor& x, const Normalisation& norm, int64_t scale);
// The heat-map over a grey version of the input: each pixel is the grey value blended
// with the map's colour at opacity 0.85·sqrt(|v|/max), so that strong evidence shows and
// the input stays visible where the map is near zero.
Image render_overlay(const Tensor& x, const Tensor& map, const Normalisation& norm, int64_t scale);

// Text in a small bitmap font (stb_easy_font), each font pixel drawn as `size`×`size`.
void draw_text(Image& image, const std::string& text, int64_t x, int64_t y, Rgb colour, int64_t size = 1);
// The width and height `text` takes at font size `size`.
int64_t text_width(const std::string& text, int64_t size = 1);
int64_t text_height(int64_t size = 1);

// A grid of tiles with a label above each column and an optional caption under each
// tile; an empty image leaves its cell blank. Tiles of a column share its widest width.
// Drawn by analysis/common/figure.h (an ImageGrid without a title): the tiles' pixels
// exactly as they are, the text in DejaVu Sans.
struct SheetCell {
  Image image;
  std::string caption;
};
struct SheetColumn {
  std::string label;
  std::vector<SheetCell> cells;  // top to bottom
};
Image contact_sheet(const std::vector<SheetColumn>& columns);

// PNG encoding (engine/io/png.h) and an atomic write of it; errors name the path.
std::string encode_png(const Image& image);
void write_png(const std::string& path, const Image& image);

}  // namespace adjoint
