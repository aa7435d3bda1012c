// 2-D convolution (ops/conv.h), as its definition: every output a sum over its window's
// taps. The fast op picks among im2col, Winograd and direct kernels (ops/conv/); all of
// them compute this. Convolution is affine in x and linear in w, so its vector-Jacobian
// product is its transpose under every transport (docs/methods.md §1.2).
#include "ops/reference/reference.h"

namespace adjoint::reference {

int64_t ConvShape::OH() const {
  return conv_output_size(H, KH, options.stride_h, options.pad_h, options.dilation_h);
}
int64_t ConvShape::OW() const {
  return conv_output_size(W, KW, options.stride_w, options.pad_w, options.dilation_w);
}

namespace {

// Calls visit(y index, x index, w index) for every product of the convolution: output
// (n, o, oh, ow) meets input channel c of o's group at tap (i, j), where the tap lies inside
// the input (padding is zero, so it adds nothing).
template <class Visit>
void for_each_tap(const ConvShape& s, Visit visit) {
  const Conv2dOptions& p = s.options;
  const int64_t OH = s.OH(), OW = s.OW();
  const int64_t Cg = s.C / p.groups, Og = s.O / p.groups;  // channels per group
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < s.KH; ++i)
              for (int64_t j = 0; j < s.KW; ++j) {
                const int64_t h = oh * p.stride_h - p.pad_h + i * p.dilation_h;
                const int64_t w = ow * p.stride_w - p.pad_w + j * p.dilation_w;
                if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                const int64_t channel = (o / Og) * Cg + c;  // the input channel, in o's group
                visit(((n * s.O + o) * OH + oh) * OW + ow, ((n * s.C + channel) * s.H + h) * s.W + w,
                      ((o * Cg + c) * s.KH + i) * s.KW + j);
              }
}

}  // namespace

// y = bias + Σ taps w·x.
Values conv2d_forward(const Values& x, const Values& w, const Values& bias, const ConvShape& s) {
  const int64_t P = s.OH() * s.OW();
  Values y(s.N * s.O * P, 0.0);
  if (!bias.empty())
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t o = 0; o < s.O; ++o)
        for (int64_t p = 0; p < P; ++p) y[(n * s.O + o) * P + p] = bias[o];
  for_each_tap(s, [&](int64_t yi, int64_t xi, int64_t wi) { y[yi] += w[wi] * x[xi]; });
  return y;
}

// Each product w·x sends u·w to x and u·x to w; the bias collects u (docs/methods.md §1.2:
// affine, one rule for every transport).
ConvGrads conv2d_backward(const Values& u, const Values& x, const Values& w, const ConvShape& s) {
  ConvGrads g{Values(x.size(), 0.0), Values(w.size(), 0.0), Values(s.O, 0.0)};
  for_each_tap(s, [&](int64_t yi, int64_t xi, int64_t wi) {
    g.dx[xi] += u[yi] * w[wi];
    g.dw[wi] += u[yi] * x[xi];
  });
  const int64_t P = s.OH() * s.OW();
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t p = 0; p < P; ++p) g.dbias[o] += u[(n * s.O + o) * P + p];
  return g;
}

}  // namespace adjoint::reference
