// Resizing 8-bit images exactly as PIL's Image.resize does (the resize of torchvision's
// evaluation presets on a PIL image), so that a preprocessed tensor matches torchvision's
// to float rounding rather than to an interpolation error.
//
// PIL's resampler, as this file implements it:
// - Separable: a horizontal pass, then a vertical pass, each skipped when that axis keeps
//   its size. The intermediate image is 8-bit: the horizontal pass rounds and clips.
// - Output pixel o of an axis of n_in → n_out pixels sits at centre c = (o + ½)·s with
//   s = n_in / n_out. The filter is stretched by max(s, 1), so shrinking averages over
//   the whole footprint (antialiasing) while enlarging interpolates. Its taps are the input
//   pixels i in [round(c − r), round(c + r)) ∩ [0, n_in), r = support·max(s, 1), with
//   weights filter((i − c + ½) / max(s, 1)), normalised to sum to 1.
// - Weights become fixed point with kPrecisionBits fractional bits (rounded half away
//   from zero); a pixel is Σ weight·value in integers, plus ½ to round, shifted back and
//   clipped to [0, 255].
// Images are interleaved (height, width, channels) bytes, as decoders give them.
#pragma once
#include <cstdint>
#include <vector>

namespace adjoint {

// The filters of PIL that torchvision's and timm's presets use.
enum class ResampleFilter {
  bilinear,  // the triangle, support 1
  bicubic,   // Keys' cubic with a = −0.5, support 2
};

// PIL's fixed-point precision for 8-bit images: 32 − 8 − 2 bits, so a sum of 8-bit values
// times weights whose magnitudes sum to at most 2 stays inside a signed 32-bit integer.
constexpr int kPrecisionBits = 22;

// The filter's value at x (in units of input pixels after the stretch).
double resample_filter(ResampleFilter filter, double x);
// The filter's half-width in input pixels before the stretch.
double resample_support(ResampleFilter filter);

// Resizes an interleaved (in_h, in_w, channels) 8-bit image to (out_h, out_w, channels).
void resample_uint8(const uint8_t* in, int64_t in_h, int64_t in_w, int64_t channels, uint8_t* out, int64_t out_h,
                    int64_t out_w, ResampleFilter filter);

}  // namespace adjoint
