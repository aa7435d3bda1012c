// e^x in plain float arithmetic, for loops that should vectorise (a libm call stops that):
// GELU's and the soft gates' activations, the soft max-pool's window weights.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace adjoint {

// e^x without a libm call, so that the loops calling it vectorise: x = k·ln 2 + r with
// |r| ≤ ln 2 / 2 (ln 2 split in two so that r is exact), e^r by its degree-7 Taylor
// polynomial (relative error < 2e-7 there, about float32's resolution) and 2^k written
// into the exponent bits. Inputs are clamped to [−87, 88], where e^x is a normal float.
[[gnu::always_inline]] inline float fast_exp(float x) {
  x = std::clamp(x, -87.0f, 88.0f);  // selects, vectorised under -fno-trapping-math (meson.build)
  const float t = x * 1.44269504f;                                   // x / ln 2
  const int32_t k = static_cast<int32_t>(t + (t >= 0 ? 0.5f : -0.5f));  // round to nearest
  const float kf = static_cast<float>(k);
  const float r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;     // x − k·ln 2
  float p = 1.0f / 5040;                                            // Σ r^n / n!, n ≤ 7, by Horner
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (k + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace adjoint
