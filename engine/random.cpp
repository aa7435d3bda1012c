#include "engine/random.h"

#include <cmath>
#include <numeric>

#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

std::array<uint32_t, 4> philox(uint64_t key, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c0 = n0, c1 = static_cast<uint32_t>(p1), c2 = n2, c3 = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

namespace {

// A float in [0, 1) from 24 random bits.
float unit(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Fills `out` with fn(words of element i): one Philox call per element (zeros from a
// generator without draws).
template <class Fn>
Tensor fill(const Shape& shape, Generator& gen, Fn fn) {
  if (!gen.draws()) {
    Tensor zeros = Tensor::zeros(shape);
    gen.reserve(static_cast<uint64_t>(zeros.numel()));
    return zeros;
  }
  Tensor out = Tensor::empty(shape);
  float* p = out.data();
  const int64_t n = out.numel();
  const uint64_t first = gen.reserve(static_cast<uint64_t>(n));
  const uint64_t key = gen.seed();
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = fn(philox(key, first + static_cast<uint64_t>(i)));
  });
  return out;
}

}  // namespace

Tensor uniform(const Shape& shape, float lo, float hi, Generator& gen) {
  check(hi >= lo, "uniform: upper bound ", hi, " is below lower bound ", lo);
  return fill(shape, gen, [=](const std::array<uint32_t, 4>& w) { return lo + (hi - lo) * unit(w[0]); });
}

Tensor normal(const Shape& shape, float mean, float std, Generator& gen) {
  check(std >= 0, "normal: negative standard deviation ", std);
  return fill(shape, gen, [=](const std::array<uint32_t, 4>& w) {
    // Box–Muller on two independent words; 1 - u keeps the log argument positive.
    const double u1 = 1.0 - (static_cast<double>(w[0]) + 0.5) / 4294967296.0;
    const double u2 = static_cast<double>(w[1]) / 4294967296.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    return static_cast<float>(mean + std * r * std::cos(2.0 * M_PI * u2));
  });
}

Tensor normal_noise(const Shape& shape, float mean, float std, Generator& gen) {
  check(std >= 0, "normal_noise: negative standard deviation ", std);
  if (!gen.draws()) {
    Tensor zeros = Tensor::zeros(shape);
    gen.reserve(static_cast<uint64_t>((zeros.numel() + 3) / 4));
    return zeros;
  }
  Tensor out = Tensor::empty(shape);
  const int64_t n = out.numel(), calls = (n + 3) / 4;
  const uint64_t first = gen.reserve(static_cast<uint64_t>(calls));
  const uint64_t key = gen.seed();
  float* p = out.data();
  parallel_for(calls, 1 << 12, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const std::array<uint32_t, 4> w = philox(key, first + static_cast<uint64_t>(c));
      float values[4];
      for (int pair = 0; pair < 2; ++pair) {
        // u1 = (2k + 1) / 2²⁴ with k < 2²³: exact in float and never 0, so the log is finite.
        const float u1 = static_cast<float>(2 * (w[2 * pair] >> 9) + 1) * (1.0f / 16777216.0f);
        const float angle = static_cast<float>(2.0 * M_PI) * unit(w[2 * pair + 1]);
        const float radius = std * std::sqrt(-2.0f * std::log(u1));
        values[2 * pair] = mean + radius * std::cos(angle);
        values[2 * pair + 1] = mean + radius * std::sin(angle);
      }
      const int64_t at = 4 * c;
      for (int64_t j = 0; j < std::min<int64_t>(4, n - at); ++j) p[at + j] = values[j];
    }
  });
  return out;
}

Tensor bernoulli(const Shape& shape, float p, Generator& gen) {
  check(p >= 0 && p <= 1, "bernoulli: probability ", p, " is outside [0, 1]");
  return fill(shape, gen, [=](const std::array<uint32_t, 4>& w) { return unit(w[0]) < p ? 1.0f : 0.0f; });
}

int64_t randint(int64_t n, Generator& gen) {
  check(n > 0, "randint: empty range [0, ", n, ")");
  const auto w = philox(gen.seed(), gen.reserve(1));
  const uint64_t bits = (uint64_t(w[0]) << 32) | w[1];
  return static_cast<int64_t>(bits % static_cast<uint64_t>(n));
}

std::vector<int64_t> permutation(int64_t n, Generator& gen) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[randint(i + 1, gen)]);
  return p;
}

}  // namespace adjoint
