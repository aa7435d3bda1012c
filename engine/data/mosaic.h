// 2×2 mosaics of four images of one shape, each image downscaled bilinearly into its
// quadrant so that the mosaic has the shape of one image. Focus scores maps on them
// (analysis/pullbacks/focus.h); the +mosaics data variant trains on them (engine/data/variants.h).
#pragma once
#include <array>
#include <cstdint>

namespace adjoint {

// Rows [top, bottom) and columns [left, right) of a quadrant.
struct MosaicQuadrant {
  int64_t top, bottom, left, right;
};

// Quadrant q of an H × W image, in reading order (0 top-left, 1 top-right, 2 bottom-left,
// 3 bottom-right); the bottom row and the right column of quadrants take the odd pixel.
MosaicQuadrant mosaic_quadrant(int q, int64_t height, int64_t width);

// Writes into `out` (C, H, W) the mosaic whose quadrant q shows tiles[q] (each (C, H, W)),
// resized by resize_bilinear. `out` overlaps no tile.
void compose_mosaic(const std::array<const float*, 4>& tiles, int64_t channels, int64_t height, int64_t width,
                    float* out);

}  // namespace adjoint
