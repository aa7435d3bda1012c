// Focus (Arias-Duart et al. 2022), docs/methods.md §1.4: a localisation test on 2×2 mosaics of
// four images, two of them of the target class. A faithful explanation of the target puts
// its positive mass on the two target tiles.
//
// To keep the model's input size, each tile is its image downscaled by bilinear
// interpolation to the quadrant's size (half the height and width; the bottom row and
// right column of tiles take the odd pixel when H or W is odd), so a mosaic has the shape
// of one image.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "analysis/pullbacks/metrics.h"

namespace adjoint {

// Quadrants in row-major order: top-left, top-right, bottom-left, bottom-right.
struct Mosaics {
  Tensor images;                                   // (M, C, H, W)
  std::vector<int64_t> targets;                    // the class of the two target tiles
  std::vector<std::array<bool, 4>> target_tiles;   // which quadrants show the target class
  std::vector<std::array<int64_t, 4>> sources;     // the pool index shown in each quadrant
};

// Builds `count` mosaics from a pool of images (P, C, H, W) with their labels. Mosaic m is
// a pure function of (pool, seed, m): a target class is drawn among the classes with at
// least two images, two distinct images of it, and two images of other classes (of two
// different classes when the pool has them), placed in a random arrangement.
Mosaics make_mosaics(const Tensor& pool, const std::vector<int64_t>& labels, int64_t count, uint64_t seed);

// Focus (higher is better) of maps (M, C, H, W) of the mosaics' targets: the positive
// attribution mass in the target quadrants over the positive mass of the whole map. NaN
// for a map with no positive value.
MetricResult focus(const Mosaics& mosaics, const Tensor& attr);

// Focus presumes that the model recognises the tiles: a map of the target's logit can only
// follow the target tiles where that logit comes from them. Recognised, per mosaic: 1 where
// the model's top class (`predicted`, one per mosaic) is the mosaic's target class, else 0.
// Their mean is the recognition rate reported beside the focus scores.
std::vector<double> recognised_mosaics(const Mosaics& mosaics, const std::vector<int64_t>& predicted);

}  // namespace adjoint
