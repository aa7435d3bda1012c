// Direct convolution on CPUs with AVX-512: ops/conv.cpp runs it in place of Winograd or
// im2col where it is faster, forward and for the input gradient. Two kernels:
//
// - By rows, for narrow layers (up to 32 channels, maps 12 to 32 wide, stride 1). With 16 or
//   32 channels, Winograd's transforms and im2col's column matrix move more memory than the
//   products do arithmetic (they run such a layer at a third of oneDNN's rate). Each output
//   row is one or two vectors of 16 positions and a register tile holds 8 or 12 output
//   channels × 2 vectors: per kernel tap and input channel, two loads of the shifted input
//   row and 16 or 24 FMAs with broadcast weights.
// - By channels, for small maps and strided layers with a multiple of 32 output channels (a
//   7×7 or 4×4 map fills few vectors of positions, and its Winograd tiles are mostly edge).
//   A register tile holds up to 14 positions of one output row × 32 output channels (two
//   vectors): per kernel tap and input channel, two loads of weights and 28 FMAs with the
//   input broadcast, the layout oneDNN's kernels keep in registers.
//
// Both read a zero-padded copy of each image, so no load needs a mask or a bounds check.
#pragma once
#include <cstdint>
#include <functional>

#include "ops/conv/prepared_weights.h"

namespace adjoint {

// One convolution without dilation or groups: x (N, C, H, W), w (O, C, KH, KW), padding
// (ph, pw), output (N, O, OH, OW), stride (sh, sw).
struct DirectConvShape {
  int64_t N, C, H, W, O, KH, KW, ph, pw, OH, OW;
  int64_t sh = 1, sw = 1;
};

// Whether direct_conv runs here (AVX-512) and suits the shape (one of its kernels is ahead
// of Winograd and im2col there; docs/benchmarks.md, "Convolution tuning constants").
bool direct_conv_runs(const DirectConvShape& s);

// y[n][o] = Σ_c Σ_ij w[o][c][i][j] · x[n][c][oh + i − ph][ow + j − pw] (zero outside x),
// every entry of y written; then finish(plane, o) on each output plane (OH·OW values of
// channel o) while it is in cache. With `adjoint_of` the weights are those of the
// convolution this one is the input gradient of: w is (C, O, KH, KW) and is read as
// w[c][o][KH−1−i][KW−1−j] (transposed and flipped).
// The sums run over c, then i, then j, in order: the same bits at any thread count. The
// weights' blocks are kept by `kept` where it keeps forms (ops/conv/prepared_weights.h).
void direct_conv(const DirectConvShape& s, const float* x, const float* w, bool adjoint_of, float* y,
                 const std::function<void(float* plane, int64_t o)>& finish,
                 const conv::PreparedWeights& kept = {});

}  // namespace adjoint
