// Figures drawn with Cairo (analysis/common/figure.h): the round tick rule, and one small
// known figure of each kind rasterised and read back pixel by pixel: its size, that it is
// not blank, where its data landed, and the colour bar of a heat-map.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "analysis/common/figure.h"
#include "analysis/common/plot.h"
#include "engine/error.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

bool near(Rgb a, Rgb b, int tolerance) {
  return std::abs(a.r - b.r) <= tolerance && std::abs(a.g - b.g) <= tolerance && std::abs(a.b - b.b) <= tolerance;
}

// The box of the pixels of colour `c` (within `tolerance`): x0, y0, x1, y1 inclusive; x0 = -1 when none.
struct Box {
  int64_t x0 = -1, y0 = -1, x1 = -1, y1 = -1, count = 0;
};
Box box_of(const Image& img, Rgb c, int tolerance, int64_t from_x = 0) {
  Box b;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = from_x; x < img.width; ++x)
      if (near(img.at(x, y), c, tolerance)) {
        if (b.count++ == 0) b.x0 = b.x1 = x, b.y0 = b.y1 = y;
        b.x0 = std::min(b.x0, x), b.x1 = std::max(b.x1, x), b.y0 = std::min(b.y0, y), b.y1 = std::max(b.y1, y);
      }
  return b;
}

int64_t distinct_colours(const Image& img) {
  std::set<uint32_t> seen;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) {
      const Rgb c = img.at(x, y);
      seen.insert(uint32_t(c.r) << 16 | uint32_t(c.g) << 8 | c.b);
    }
  return int64_t(seen.size());
}

// The dark (text or axis) pixels inside a rectangle.
int64_t dark_pixels(const Image& img, int64_t x0, int64_t y0, int64_t x1, int64_t y1) {
  int64_t n = 0;
  for (int64_t y = std::max<int64_t>(0, y0); y < std::min(y1, img.height); ++y)
    for (int64_t x = std::max<int64_t>(0, x0); x < std::min(x1, img.width); ++x) {
      const Rgb c = img.at(x, y);
      n += c.r < 100 && c.g < 100 && c.b < 100;
    }
  return n;
}

uint32_t png_dimension(const std::string& png, size_t at) {
  return uint32_t(uint8_t(png[at])) << 24 | uint32_t(uint8_t(png[at + 1])) << 16 | uint32_t(uint8_t(png[at + 2])) << 8 |
         uint32_t(uint8_t(png[at + 3]));
}

}  // namespace

TEST_CASE("figures: round ticks are multiples of 1, 2 or 5 × 10^k inside the range") {
  CHECK(nice_ticks(0, 1) == std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1});
  const std::vector<double> close = nice_ticks(0.97, 1.0);  // a narrow range: each tick its own colour
  REQUIRE(close.size() == 4);
  CHECK(close.front() == doctest::Approx(0.97));
  CHECK(close.back() == doctest::Approx(1.0));
  CHECK(tick_label(close[1], close[1] - close[0]) == "0.98");
  CHECK(nice_ticks(0, 1400) == std::vector<double>{0, 500, 1000});
  CHECK(tick_label(1000, 500) == "1000");
  CHECK(nice_range(0.13, 0.87) == std::pair<double, double>{0.0, 1.0});
  const std::vector<double> negative = nice_ticks(-1, 1);
  CHECK(std::find(negative.begin(), negative.end(), 0.0) != negative.end());
  CHECK(tick_label(0, 0.5) == "0.0");
  CHECK_THROWS_AS(nice_ticks(1, 1), Error);
}

TEST_CASE("figures: a line chart puts a rising series low on the left and high on the right, and writes PNG and SVG") {
  const Rgb red{214, 39, 40};
  LineChart chart{.title = "loss of tiny-mlp on modadd:7, AdamW", .x_label = "step", .y_label = "loss",
                  .x = {0, 1, 2, 3, 4}, .series = {{"rising", {0, 1, 2, 3, 4}, red}}};
  const Figure figure(chart);
  const Image img = figure.pixels();
  CHECK(img.width == figure.width());
  CHECK(img.height == figure.height());
  CHECK(img.width >= 600);
  CHECK(distinct_colours(img) > 20);  // anti-aliased lines and text, not a blank page
  // The series' own colour: its leftmost pixel is lower on the page than its rightmost.
  const Box line = box_of(img, red, 0);
  REQUIRE(line.count > 200);
  int64_t left_y = -1, right_y = -1;
  for (int64_t y = 0; y < img.height; ++y) {
    if (img.at(line.x0, y) == red) left_y = y;
    if (img.at(line.x1, y) == red && right_y < 0) right_y = y;
  }
  CHECK(left_y > right_y + 200);  // y = 0 at the bottom, y = 4 near the top of a 300-pixel plot
  CHECK(dark_pixels(img, 0, 0, img.width, 30) > 50);  // the title

  const std::string png = figure.png();
  REQUIRE(png.size() > 24);
  CHECK(png.substr(1, 3) == "PNG");
  CHECK(png_dimension(png, 16) == uint32_t(img.width));
  CHECK(png_dimension(png, 20) == uint32_t(img.height));
  const std::string svg = figure.svg();
  CHECK(contains(svg, "<svg"));
  CHECK(contains(svg, "</svg>"));
  CHECK(contains(svg, cat("width=\"", img.width)));
  // Drawn again, after more surfaces: the same bytes (Cairo counts the process's surfaces in
  // the names it gives, which the SVG renumbers per document).
  CHECK(contains(svg, "id=\"surface1\""));
  CHECK(figure.svg() == svg);

  chart.series[0].y.pop_back();
  CHECK_THROWS_WITH_AS(Figure{chart}, doctest::Contains("'rising' has 4 values for 5"), Error);
}

TEST_CASE("figures: a heat-map colours each cell by its value and has a colour bar with values") {
  // [ +1  -1 ]
  // [ 0.5 NaN ] on a diverging scale -1..1: red, blue, light red, grey (not measured).
  const HeatMap map{.title = "tensor similarity, checkpoints of tiny-mlp", .x_label = "step", .y_label = "step",
                    .rows = 2, .cols = 2, .values = {1, -1, 0.5, NAN}, .row_labels = {"a", "b"},
                    .col_labels = {"a", "b"}, .lo = -1, .hi = 1, .scale = ColourScale::Diverging,
                    .range_note = "scale fixed at -1 to 1"};
  const Image img = Figure(map).pixels();
  const Box red = box_of(img, {255, 0, 0}, 0);  // exactly red: the +1 cell only (the bar stops short of it)
  REQUIRE(red.count > 0);
  const int64_t cell = red.x1 - red.x0 + 1;
  CHECK(cell == red.y1 - red.y0 + 1);   // square cells
  CHECK(red.count == cell * cell);      // one solid cell
  CHECK(cell >= 30);
  const auto centre = [&](int64_t r, int64_t c) { return img.at(red.x0 + c * cell + cell / 2, red.y0 + r * cell + cell / 2); };
  CHECK(centre(0, 1) == Rgb{0, 0, 255});
  CHECK(near(centre(1, 0), Rgb{255, 128, 128}, 1));
  CHECK(centre(1, 1) == Rgb{200, 200, 200});
  // The colour bar right of the grid: a column red-ish at its top and blue-ish at its bottom.
  const int64_t grid_right = red.x0 + 2 * cell;
  const Box bar_red = box_of(img, {255, 0, 0}, 12, grid_right);
  const Box bar_blue = box_of(img, {0, 0, 255}, 12, grid_right);
  REQUIRE(bar_red.count > 0);
  REQUIRE(bar_blue.count > 0);
  CHECK(bar_red.x0 == bar_blue.x0);
  CHECK(bar_red.y1 < bar_blue.y0);
  CHECK(bar_blue.y1 - bar_red.y0 > 100);
  CHECK(dark_pixels(img, bar_red.x1 + 4, bar_red.y0 - 10, img.width, bar_blue.y1 + 10) > 40);  // its values
  CHECK(dark_pixels(img, 0, red.y0 + 2 * cell, img.width, img.height) > 100);  // labels and the note under it

  HeatMap wrong = map;
  wrong.values.pop_back();
  CHECK_THROWS_WITH_AS(Figure{wrong}, doctest::Contains("3 values for 2x2"), Error);
  wrong = map;
  wrong.hi = wrong.lo;
  CHECK_THROWS_WITH_AS(Figure{wrong}, doctest::Contains("colour range"), Error);
}

TEST_CASE("figures: the score matrix of the old signature keeps its cells' colours on the data's scale") {
  const Image img = score_matrix("relative score, a -> b", {1.0, 0.5}, 1, 2, {"0 stem"}, {"0 stem", "1 head"},
                                 "front block", "end block", 0.0, 1.0);
  const Box red = box_of(img, {255, 0, 0}, 0);
  REQUIRE(red.count > 0);
  const int64_t cell = red.y1 - red.y0 + 1;
  // 0.5 on white→red over [0, 1]: half-way (the value text is printed in the cell's middle, so look off-centre).
  CHECK(near(img.at(red.x0 + cell + 3, red.y0 + 3), Rgb{255, 128, 128}, 1));
}

TEST_CASE("figures: an image grid shows each picture pixel for pixel under its column's label") {
  Image green(10, 10, {0, 200, 0}), magenta(6, 8, {200, 0, 200});
  const ImageGrid grid{"IRIs of tiny-mlp block 1", {{"image 0", {{green, "x (target)"}}}, {"image 1", {{magenta, "x'"}}}}};
  const Image img = Figure(grid).pixels();
  const Box g = box_of(img, {0, 200, 0}, 0), m = box_of(img, {200, 0, 200}, 0);
  CHECK(g.count == 100);
  CHECK(g.x1 - g.x0 + 1 == 10);
  CHECK(m.count == 48);
  CHECK(m.x0 > g.x1);        // the second column right of the first
  CHECK(g.y0 == m.y0);       // both at the top of the row
  CHECK(dark_pixels(img, g.x0 - 20, g.y0 - 22, g.x1 + 20, g.y0) > 10);  // the column label above
  CHECK_THROWS_WITH_AS(Figure(ImageGrid{"nothing", {}}), doctest::Contains("no images"), Error);
}
