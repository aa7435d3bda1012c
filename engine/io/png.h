// Writing 8-bit RGB pictures as PNG (ISO/IEC 15948), compressed with zlib.
//
// The pictures of a report are made to be looked at, once, and a report of a few images
// spends more time compressing them than anything else around its methods, so the encoder
// is chosen for speed at a size close to a thorough one (docs/benchmarks.md has the
// measurements): each row gets the filter that makes its bytes smallest in magnitude (the
// usual heuristic of PNG encoders), and zlib deflates the filtered rows looking only for runs
// of a repeated byte (Z_RLE), the matches filtering leaves in a picture.
#pragma once
#include <cstdint>
#include <string>

namespace adjoint {

// The PNG file of a `width` × `height` picture whose `rgb` holds its rows top to bottom,
// each pixel's red, green and blue bytes in turn. Throws Error for an empty picture.
std::string encode_png_rgb(const uint8_t* rgb, int64_t width, int64_t height);

}  // namespace adjoint
