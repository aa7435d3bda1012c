// Identically represented inputs (docs/methods.md §2.3): for every image x, an input x′ that
// the front model A cannot tell from x at its block i, found by minimising
//   r(x′) = ‖A_{≤i}(x′) − A_{≤i}(x)‖₂ / ‖A_{≤i}(x)‖₂
// over raw images x′ ∈ [0, 1] from a start x₀ that is another image of the set (a
// derangement: no image starts from itself) or uniform noise. The search is the input-space
// optimiser (analysis/common/input_search.h): normalised L2 steps of 0.5·sqrt(D/3072) (the
// published step for 3×32×32 inputs, the same per-pixel step on any size D = C·H·W), 1000
// of them, the best iterate kept, every iterate clamped to [0, 1]; or Adam.
//
// An IRI set is only as good as its distances: the quality (median, 90th percentile, share
// below 0.05) is part of every result, and a set whose median is not below 0.05 is poor.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/common/input_search.h"
#include "analysis/stitching/pair.h"

namespace adjoint {

struct IriOptions {
  InputSearchOptions search;    // search.step ≤ 0: default_iri_step (l2), 0.01 (adam)
  std::string start = "derangement";  // derangement | noise
  int64_t batch = 128;          // images searched at once
  uint64_t seed = 0;            // the derangement or the noise
};

// 0.5·sqrt(D/3072) for examples of `example` shape (C, H, W) in [0, 1] units.
float default_iri_step(const Shape& example);

struct IriQuality {
  int64_t count = 0;
  double median = 0, p90 = 0, share_below = 0;  // share of distances below `threshold`
  double threshold = 0.05;
  bool poor() const { return !(median < threshold); }
  std::string summary() const;  // "relative distance median 0.012, 90th percentile 0.03, 97% below 0.05"
};
IriQuality iri_quality(const std::vector<double>& distances, double threshold = 0.05);

struct IriSet {
  Tensor inputs;                  // x′ (N, C, H, W), raw
  Tensor starts;                  // x₀
  std::vector<int64_t> start_index;  // x₀'s index in the set (−1: a noise start)
  std::vector<double> distance;   // r(x′) per image
  IriQuality quality;
};

// IRIs of the raw images `x` (N ≥ 2 for a derangement) for A = `front` cut after `block`.
// `progress(done, total)` is called after every batch. Throws Error on an empty set.
IriSet find_iris(const Endpoint& front, size_t block, const Tensor& x, const IriOptions& options,
                 const std::function<void(int64_t, int64_t)>& progress = {});

// A random derangement of 0..n−1 (no fixed point; n ≥ 2): the successor in a random cycle.
std::vector<int64_t> derangement(int64_t n, Generator& gen);

}  // namespace adjoint
