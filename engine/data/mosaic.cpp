#include "engine/data/mosaic.h"

#include <algorithm>
#include <vector>

#include "engine/data/transform.h"

namespace adjoint {

MosaicQuadrant mosaic_quadrant(int q, int64_t height, int64_t width) {
  const int64_t mid_y = height / 2, mid_x = width / 2;
  const bool lower = q >= 2, righthand = q % 2 == 1;
  return {lower ? mid_y : 0, lower ? height : mid_y, righthand ? mid_x : 0, righthand ? width : mid_x};
}

void compose_mosaic(const std::array<const float*, 4>& tiles, int64_t channels, int64_t height, int64_t width,
                    float* out) {
  std::vector<float> tile;
  for (int q = 0; q < 4; ++q) {
    const MosaicQuadrant r = mosaic_quadrant(q, height, width);
    const int64_t h = r.bottom - r.top, w = r.right - r.left;
    tile.resize(static_cast<size_t>(channels * h * w));
    resize_bilinear(tiles[static_cast<size_t>(q)], channels, height, width, tile.data(), h, w);
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t y = 0; y < h; ++y)
        std::copy_n(tile.data() + (c * h + y) * w, w, out + (c * height + r.top + y) * width + r.left);
  }
}

}  // namespace adjoint
