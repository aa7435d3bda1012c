// The PNG writer (engine/io/png.h): every picture must decode to its own pixels through
// the engine's checked decoder (chunk CRCs and zlib's checksum verified), each of PNG's five
// filters must be chosen where it is the best, and the file must hold what the format says.
#include <doctest/doctest.h>
#include <zlib.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/data/image_folder.h"
#include "engine/error.h"
#include "engine/io/png.h"

using namespace adjoint;

namespace {

struct Picture {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// A picture whose byte (x, y, channel) is `value`.
Picture picture(int64_t width, int64_t height, const std::function<int(int64_t, int64_t, int64_t)>& value) {
  Picture p{width, height, std::vector<uint8_t>(size_t(width * height * 3))};
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < 3; ++c) p.rgb[size_t((y * width + x) * 3 + c)] = uint8_t(value(x, y, c));
  return p;
}

uint32_t big_endian(const std::string& bytes, size_t at) {
  return uint32_t(uint8_t(bytes[at])) << 24 | uint32_t(uint8_t(bytes[at + 1])) << 16 |
         uint32_t(uint8_t(bytes[at + 2])) << 8 | uint32_t(uint8_t(bytes[at + 3]));
}

// The filter type of each row, read from the file itself: its chunks walked (each CRC
// checked), IHDR's fields checked, the IDAT data inflated by zlib.
std::vector<int> row_filters(const std::string& png, const Picture& p) {
  REQUIRE(png.size() > 8);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  std::vector<std::string> types;
  std::string data;
  for (size_t at = 8; at < png.size();) {
    REQUIRE(at + 12 <= png.size());
    const uint32_t length = big_endian(png, at);
    REQUIRE(at + 12 + length <= png.size());
    const std::string type = png.substr(at + 4, 4);
    const auto* typed = reinterpret_cast<const Bytef*>(png.data() + at + 4);
    CHECK(big_endian(png, at + 8 + length) == uint32_t(crc32_z(0, typed, length + 4)));
    if (type == "IHDR") {
      REQUIRE(length == 13);
      CHECK(big_endian(png, at + 8) == uint32_t(p.width));
      CHECK(big_endian(png, at + 12) == uint32_t(p.height));
      CHECK(png.substr(at + 16, 5) == std::string("\x08\x02\x00\x00\x00", 5));  // 8 bits, RGB, methods 0
    }
    if (type == "IDAT") data += png.substr(at + 8, length);
    types.push_back(type);
    at += 12 + length;
  }
  CHECK(types == std::vector<std::string>{"IHDR", "IDAT", "IEND"});
  const size_t row_bytes = size_t(p.width * 3 + 1);
  std::vector<uint8_t> rows(row_bytes * size_t(p.height));
  uLongf produced = uLongf(rows.size());
  REQUIRE(uncompress(rows.data(), &produced, reinterpret_cast<const Bytef*>(data.data()), uLong(data.size())) == Z_OK);
  REQUIRE(produced == rows.size());
  std::vector<int> filters;
  for (int64_t y = 0; y < p.height; ++y) filters.push_back(rows[size_t(y) * row_bytes]);
  return filters;
}

// Encodes `p`, decodes the file with the engine's checked decoder and compares every byte;
// returns the filters its rows use.
std::vector<int> round_trip(const Picture& p) {
  const std::string png = encode_png_rgb(p.rgb.data(), p.width, p.height);
  const DecodedImage back =
      decode_image_bytes(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "encoded.png", 3);
  CHECK(back.width == p.width);
  CHECK(back.height == p.height);
  CHECK(back.pixels == p.rgb);
  return row_filters(png, p);
}

}  // namespace

TEST_CASE("png: pictures of every shape decode to their own pixels") {
  uint32_t state = 12345;
  const auto noise = [&](int64_t, int64_t, int64_t) { return int((state = state * 1103515245u + 12345u) >> 24); };
  for (const auto& [width, height] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 9}, {9, 1}, {2, 3}, {37, 23}, {224, 224}}) {
    CAPTURE(width);
    CAPTURE(height);
    round_trip(picture(width, height, noise));
    round_trip(picture(width, height, [](int64_t x, int64_t y, int64_t c) { return (x * 9 + y * 5 + c * 80) % 256; }));
    round_trip(picture(width, height, [](int64_t, int64_t, int64_t) { return 255; }));
  }
}

TEST_CASE("png: each row takes the filter that predicts it best, all five of them") {
  // Pictures whose rows one filter predicts best, the filter expected on every row but the
  // first (whose row above is zeros). Ties go to the lower filter type.
  uint32_t state = 777;
  std::vector<int> column(64);
  for (int& v : column) v = int((state = state * 1103515245u + 12345u) >> 25);  // 0..127
  // Sub: a ramp across, each row shifted by 0 or 100 (Up and Paeth see the shift).
  const auto ramp_across = [](int64_t x, int64_t y, int64_t) { return int(5 * x + (y % 2) * 100); };
  // Up: every row the same noise.
  const auto same_as_above = [&](int64_t x, int64_t, int64_t c) { return column[size_t((x * 3 + c) % 64)]; };
  // Paeth: the left half constant down each column, the right half constant along each row,
  // so that the neighbour to copy changes half way (Up and Sub each miss one half).
  const auto two_halves = [&](int64_t x, int64_t y, int64_t c) {
    return x < 12 ? column[size_t((x * 3 + c) % 64)] : int((y % 2) * 100 + 20 + c);
  };
  // Average: each byte the mean of its left and upper neighbours (PNG's own rounding), from
  // a noisy first row and a first column halved from row to row.
  Picture mean_of_neighbours = picture(24, 24, [](int64_t, int64_t, int64_t) { return 0; });
  const auto at = [&](int64_t x, int64_t y, int64_t c) -> uint8_t& {
    return mean_of_neighbours.rgb[size_t((y * 24 + x) * 3 + c)];
  };
  for (int64_t y = 0; y < 24; ++y)
    for (int64_t x = 0; x < 24; ++x)
      for (int64_t c = 0; c < 3; ++c)
        at(x, y, c) = y == 0 ? uint8_t(column[size_t((x * 3 + c) % 64)] * 2)
                      : x == 0 ? uint8_t(at(0, y - 1, c) >> 1)
                               : uint8_t((at(x - 1, y, c) + at(x, y - 1, c)) >> 1);
  const std::vector<std::pair<Picture, int>> cases = {
      {picture(24, 24, [](int64_t, int64_t, int64_t) { return 0; }), 0},  // None
      {picture(24, 24, ramp_across), 1},                                   // Sub
      {picture(24, 24, same_as_above), 2},                                 // Up
      {mean_of_neighbours, 3},                                             // Average
      {picture(24, 24, two_halves), 4},                                    // Paeth
  };
  std::set<int> seen;
  for (const auto& [p, expected] : cases) {
    CAPTURE(expected);
    const std::vector<int> filters = round_trip(p);
    for (size_t y = 1; y < filters.size(); ++y) CHECK(filters[y] == expected);
    seen.insert(filters.begin(), filters.end());
  }
  CHECK(seen == std::set<int>{0, 1, 2, 3, 4});
}

TEST_CASE("png: an empty picture is refused in one line") {
  const uint8_t pixel[3] = {1, 2, 3};
  CHECK_THROWS_WITH_AS(encode_png_rgb(pixel, 0, 5), doctest::Contains("encode_png: empty picture 0x5"), Error);
  CHECK_THROWS_WITH_AS(encode_png_rgb(pixel, 5, 0), doctest::Contains("encode_png: empty picture 5x0"), Error);
}
