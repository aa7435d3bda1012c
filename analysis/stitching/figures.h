// The pictures and matrices of a stitching sweep (docs/methods.md §2.4), written beside its
// tables by analysis/stitching/protocol.cpp.
//
//   layer maps   per objective × protocol, the relative score of every (front block i,
//                end block j) the sweep measured, as a matrix with A's blocks down and B's
//                across: layer_map_<objective>_<protocol>.csv and .png, and all of them in
//                layer_maps.md, with a .svg of each picture. A pair the sweep did not measure
//                is empty (grey). Drawn by analysis/common/figure.h, with a colour bar.
//   IRI grid     a few IRIs of one front block beside the images they imitate: one column
//                per image, rows x (the target), x₀ (the start) and x′ (the IRI, captioned
//                with its relative distance ‖A_i(x′) − A_i(x)‖ / ‖A_i(x)‖); PNG and SVG.
// Every file is written atomically.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

struct StitchCell;

// Writes the layer maps of `cells` into `dir`; `title` names the pair ("a.ckpt → b.ckpt").
void write_layer_maps(const std::string& dir, const std::string& title, const std::vector<StitchCell>& cells);

// The IRI grid of the first `count` images: `targets` x, `starts` x₀ and `iris` x′ are raw
// images (N, C, H, W) in [0, 1], `distance` one value per image.
void write_iri_grid(const std::string& path, const std::string& title, const Tensor& targets, const Tensor& starts,
                    const Tensor& iris, const std::vector<double>& distance, int64_t count = 8);

}  // namespace adjoint
