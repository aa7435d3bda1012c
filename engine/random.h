// Counter-based random numbers (Philox4x32-10). Element i of a draw is a pure function
// of (seed, counter + i), so a parallel fill gives the same tensor at any thread count
// and in any order. A Generator only hands out counter ranges.
#pragma once
#include <array>
#include <cstdint>

#include "engine/tensor.h"

namespace adjoint {

// Four 32-bit random words for (key, counter).
std::array<uint32_t, 4> philox(uint64_t key, uint64_t counter);

class Generator {
public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  // A generator whose fills give zeros without drawing (counters are still reserved), for
  // building a model whose every parameter a weights file then overwrites: the draws of a
  // ResNet-50's 25 million weights would be thrown away.
  static Generator without_draws() {
    Generator gen;
    gen.draws_ = false;
    return gen;
  }
  bool draws() const { return draws_; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed, offset_ = offset; }
  // Reserves `n` consecutive counters and returns the first.
  uint64_t reserve(uint64_t n) {
    uint64_t first = offset_;
    offset_ += n;
    return first;
  }

private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
  bool draws_ = true;
};

// Fills with U[lo, hi), N(mean, std²), or a {0,1} mask with P(1) = p.
Tensor uniform(const Shape& shape, float lo, float hi, Generator& gen);
Tensor normal(const Shape& shape, float mean, float std, Generator& gen);
Tensor bernoulli(const Shape& shape, float p, Generator& gen);
// N(mean, std²) noise, cheaper a value than normal(): each Philox call gives four values
// (both Box–Muller outputs of each pair of its words) computed in float, each radius from a
// 23-bit uniform, so |value − mean| < 5.8 std. For noise added to inputs (SmoothGrad's
// copies), where the far tail does not matter and draws are many. Values 4c..4c+3 come from
// the draw's c-th counter, so the draw reserves ⌈numel/4⌉ counters and, like the others,
// does not depend on the thread count.
Tensor normal_noise(const Shape& shape, float mean, float std, Generator& gen);
// A uniformly random permutation of 0..n-1 (Fisher–Yates driven by the generator).
std::vector<int64_t> permutation(int64_t n, Generator& gen);
// A uniform integer in [0, n).
int64_t randint(int64_t n, Generator& gen);

}  // namespace adjoint
