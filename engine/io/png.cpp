#include "engine/io/png.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/error.h"
#include "engine/io/crc32.h"

namespace adjoint {

namespace {

constexpr int64_t kPixelBytes = 3;  // RGB, 8 bits a channel
// Deflate's matches limited to runs of one byte (zlib's Z_RLE strategy; its level then only
// says "compress"): on filtered rows they are most of what a full search finds, and finding
// them costs a fraction of it (docs/benchmarks.md).
constexpr int kDeflateLevel = 1;
constexpr int kDeflateStrategy = Z_RLE;

// The five filters of PNG's filter method 0 (ISO/IEC 15948 §9.2), applied to one row:
// each byte minus a prediction from the byte a pixel to its left (a), the byte above (b)
// and the byte above that one's left (c), all 0 outside the picture.
enum Filter : uint8_t { kNone = 0, kSub = 1, kUp = 2, kAverage = 3, kPaeth = 4 };
constexpr int kFilters = 5;

uint8_t paeth_predictor(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return uint8_t(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

// Row `row` (`bytes` long) filtered by `filter` into `out`; `above` is the row above it,
// or all zeros for the first row. The first pixel has nothing to its left (a = c = 0).
void filter_row(Filter filter, const uint8_t* row, const uint8_t* above, int64_t bytes, uint8_t* out) {
  const int64_t first = std::min(bytes, kPixelBytes);
  switch (filter) {
    case kNone:
      std::memcpy(out, row, size_t(bytes));
      return;
    case kSub:
      for (int64_t i = 0; i < first; ++i) out[i] = row[i];
      for (int64_t i = first; i < bytes; ++i) out[i] = uint8_t(row[i] - row[i - kPixelBytes]);
      return;
    case kUp:
      for (int64_t i = 0; i < bytes; ++i) out[i] = uint8_t(row[i] - above[i]);
      return;
    case kAverage:
      for (int64_t i = 0; i < first; ++i) out[i] = uint8_t(row[i] - (above[i] >> 1));
      for (int64_t i = first; i < bytes; ++i) out[i] = uint8_t(row[i] - ((row[i - kPixelBytes] + above[i]) >> 1));
      return;
    case kPaeth:
      for (int64_t i = 0; i < first; ++i) out[i] = uint8_t(row[i] - paeth_predictor(0, above[i], 0));
      for (int64_t i = first; i < bytes; ++i)
        out[i] = uint8_t(row[i] - paeth_predictor(row[i - kPixelBytes], above[i], above[i - kPixelBytes]));
      return;
  }
}

// How large the filtered bytes are, read as signed numbers: the smaller, the better
// deflate tends to do on the row.
uint64_t magnitude(const uint8_t* bytes, int64_t count) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += uint64_t(std::abs(int(int8_t(bytes[i]))));
  return sum;
}

// The picture's rows as PNG's image data before compression: each row its filter type
// byte, then its filtered bytes, the filter chosen per row for the smallest magnitude.
std::vector<uint8_t> filtered_rows(const uint8_t* rgb, int64_t width, int64_t height) {
  const int64_t row_bytes = width * kPixelBytes;
  std::vector<uint8_t> out(size_t(height * (row_bytes + 1)));
  const std::vector<uint8_t> zeros(size_t(row_bytes), 0);
  std::array<std::vector<uint8_t>, kFilters> candidates;
  for (std::vector<uint8_t>& c : candidates) c.resize(size_t(row_bytes));
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* row = rgb + y * row_bytes;
    const uint8_t* above = y > 0 ? row - row_bytes : zeros.data();
    int best = 0;
    uint64_t best_magnitude = std::numeric_limits<uint64_t>::max();
    for (int f = 0; f < kFilters; ++f) {
      filter_row(Filter(f), row, above, row_bytes, candidates[size_t(f)].data());
      const uint64_t m = magnitude(candidates[size_t(f)].data(), row_bytes);
      if (m < best_magnitude) best = f, best_magnitude = m;
    }
    uint8_t* line = out.data() + y * (row_bytes + 1);
    line[0] = uint8_t(best);
    std::memcpy(line + 1, candidates[size_t(best)].data(), size_t(row_bytes));
  }
  return out;
}

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += char((v >> shift) & 0xff);
}

// A chunk: its length, its type, its data and the CRC-32 of type and data.
void put_chunk(std::string& out, const char type[4], const uint8_t* data, size_t bytes) {
  put_u32(out, uint32_t(bytes));
  const size_t type_at = out.size();
  out.append(type, 4);
  if (bytes > 0) out.append(reinterpret_cast<const char*>(data), bytes);
  const auto* typed = reinterpret_cast<const Bytef*>(out.data() + type_at);
  put_u32(out, crc32_update(0, typed, bytes + 4));
}

}  // namespace

std::string encode_png_rgb(const uint8_t* rgb, int64_t width, int64_t height) {
  check(width > 0 && height > 0, "encode_png: empty picture ", width, "x", height);
  // PNG's sizes are 31-bit; zlib's counts 32-bit (a picture beyond either is no report's).
  constexpr int64_t kMaxSide = std::numeric_limits<int32_t>::max();
  check(width <= kMaxSide && height <= kMaxSide && (width * kPixelBytes + 1) <= kMaxSide / height,
        "encode_png: a picture of ", width, "x", height, " is too large to encode");
  const std::vector<uint8_t> rows = filtered_rows(rgb, width, height);

  z_stream stream{};
  check(deflateInit2(&stream, kDeflateLevel, Z_DEFLATED, 15, 8, kDeflateStrategy) == Z_OK,
        "encode_png: zlib cannot start deflating");
  std::vector<uint8_t> packed(deflateBound(&stream, uLong(rows.size())));
  stream.next_in = const_cast<Bytef*>(rows.data());
  stream.avail_in = uInt(rows.size());
  stream.next_out = packed.data();
  stream.avail_out = uInt(packed.size());
  const int status = deflate(&stream, Z_FINISH);  // one call: the output holds deflateBound's bytes
  packed.resize(stream.total_out);
  deflateEnd(&stream);
  check(status == Z_STREAM_END, "encode_png: zlib failed to deflate a ", width, "x", height, " picture");

  std::string png("\x89PNG\r\n\x1a\n", 8);
  uint8_t header[13] = {};
  for (int k = 0; k < 4; ++k) {
    header[k] = uint8_t(uint32_t(width) >> (24 - 8 * k));
    header[4 + k] = uint8_t(uint32_t(height) >> (24 - 8 * k));
  }
  header[8] = 8;  // bits per channel
  header[9] = 2;  // colour type: RGB; compression, filter method and interlace stay 0
  put_chunk(png, "IHDR", header, sizeof header);
  put_chunk(png, "IDAT", packed.data(), packed.size());
  put_chunk(png, "IEND", nullptr, 0);
  return png;
}

}  // namespace adjoint
