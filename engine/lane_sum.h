// Row reductions that vectorise yet keep a fixed order of operations.
//
// A single running sum pins a loop to one add at a time (the compiler may not reassociate
// float additions); independent lanes let it run a vector of adds at once. The lanes are
// summed in a fixed order whatever the vector width or thread count, so the results are the
// same bits everywhere.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace adjoint {

// Σ a(l) and Σ b(l) over l < n, in one pass over the values both read: eight float lanes
// each, summed in a fixed order, combined in double.
template <class TermA, class TermB>
std::pair<double, double> lane_sums(int64_t n, TermA a, TermB b) {
  constexpr int kLanes = 8;
  float lanes_a[kLanes] = {}, lanes_b[kLanes] = {};
  int64_t l = 0;
  for (; l + kLanes <= n; l += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes_a[k] += a(l + k), lanes_b[k] += b(l + k);
  double sum_a = 0, sum_b = 0;
  for (; l < n; ++l) sum_a += a(l), sum_b += b(l);
  for (int k = 0; k < kLanes; ++k) sum_a += lanes_a[k], sum_b += lanes_b[k];
  return {sum_a, sum_b};
}

// Σ term(l) over l < n, summed as lane_sums sums (the unused second sum compiles away).
template <class Term>
double lane_sum(int64_t n, Term term) {
  return lane_sums(n, term, [](int64_t) { return 0.0f; }).first;
}

// max over l < n of x[l] (n ≥ 1; −inf for n = 0), in eight lanes. A maximum does not depend
// on the order it is taken in, so this equals std::max_element's (NaN aside).
inline float lane_max(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -INFINITY);
  int64_t l = 0;
  for (; l + kLanes <= n; l += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] = std::max(lanes[k], x[l + k]);
  float top = -INFINITY;
  for (; l < n; ++l) top = std::max(top, x[l]);
  for (int k = 0; k < kLanes; ++k) top = std::max(top, lanes[k]);
  return top;
}

}  // namespace adjoint
