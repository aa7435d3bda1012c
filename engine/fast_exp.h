// e^x in plain float arithmetic, for loops that should vectorise (a libm call stops that):
// GELU's and the soft gates' activations, the soft max-pool's window weights.
#pragma once
#include <algorithm>
#include <cmath>
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

// e^x by the method of fast_exp, each step of its reduction and polynomial one fused
// multiply-add: about half the instructions. std::fma rounds once, exactly as IEEE defines
// it, so the result is the same bits on every CPU and vector width; but on plain x86-64
// (no FMA instructions) each std::fma is a libm call, so use it only in loops under
// run_widest, whose AVX2 and AVX-512 bodies have FMA (engine/vectorize.h). The nearest
// integer k to x / ln 2 comes from adding 1.5·2²³, which leaves k in the low bits of the
// sum: no conversions.
[[gnu::always_inline]] inline float fast_exp_fused(float x) {
  x = std::clamp(x, -87.0f, 88.0f);
  constexpr float kShifter = 12582912.0f;  // 1.5·2²³: the sum's last bit is worth 1
  const float shifted = std::fma(x, 1.44269504f, kShifter);
  const float kf = shifted - kShifter;  // k = round(x / ln 2), exactly
  float r = std::fma(kf, -0.693359375f, x);  // x − k·ln 2, ln 2 in two parts so r is exact
  r = std::fma(kf, 2.12194440e-4f, r);
  float p = 1.0f / 5040;  // Σ r^n / n!, n ≤ 7, by Horner
  p = std::fma(p, r, 1.0f / 720);
  p = std::fma(p, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  uint32_t shifted_bits, shifter_bits;  // unsigned: k < 0 wraps, and a NaN's bits shift, without overflow
  std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  std::memcpy(&shifter_bits, &kShifter, sizeof shifter_bits);
  const uint32_t bits = (shifted_bits - shifter_bits + 127) << 23;  // 2^k
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace adjoint
