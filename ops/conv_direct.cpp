#include "ops/conv_direct.h"

#include <algorithm>
#include <vector>

#include "engine/error.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ADJOINT_AVX512 [[gnu::target("avx512f")]]
#endif

namespace adjoint {

#if defined(__x86_64__)

namespace {

// Output channels per register tile: 12, or 8 when the channel count is a multiple of 8
// but not of 12 (16 or 32 channels in blocks of 12 would leave a third or a ninth idle).
constexpr int64_t kMaxBlock = 12;
int64_t block_size(int64_t O) { return O % 8 == 0 && O % 12 != 0 ? 8 : 12; }
// A padded input row: kLeft zeros (aligned), the row, zeros to a multiple of 16 past it.
constexpr int64_t kLeft = 16;
constexpr int64_t kMaxWidth = 64;

// The weights in blocks of `block` output channels: packed[b][c][i][j][q] = weight of output
// channel b·block + q (zero past the last), input channel c, tap (i, j).
std::vector<float> pack_weights(const DirectConvShape& s, const float* w, bool adjoint_of, int64_t block) {
  const int64_t blocks = (s.O + block - 1) / block, taps = s.KH * s.KW;
  std::vector<float> packed(static_cast<size_t>(blocks * s.C * taps * block), 0.0f);
  for (int64_t o = 0; o < s.O; ++o)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t i = 0; i < s.KH; ++i)
        for (int64_t j = 0; j < s.KW; ++j) {
          const float value = adjoint_of ? w[((c * s.O + o) * s.KH + (s.KH - 1 - i)) * s.KW + (s.KW - 1 - j)]
                                         : w[((o * s.C + c) * s.KH + i) * s.KW + j];
          packed[(((o / block) * s.C + c) * taps + i * s.KW + j) * block + o % block] = value;
        }
  return packed;
}

ADJOINT_AVX512 __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << std::max<int64_t>(n, 0)) - 1u);
}

// One image, zero-padded: C planes of OH + KH − 1 rows (ph zero rows above, the rest below)
// of `stride` floats, input column q at kLeft + q. Every load of the kernel then reads
// memory of this buffer, and zeros wherever the convolution reads padding.
struct PaddedImage {
  int64_t rows, stride;
  std::vector<float> data;
  PaddedImage(const DirectConvShape& s)
      : rows(s.OH + s.KH - 1), stride(kLeft + (s.W + s.KW + 16 + 15) / 16 * 16),
        data(static_cast<size_t>(s.C * rows * stride), 0.0f) {}
  void fill(const DirectConvShape& s, const float* image) {
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t h = 0; h < s.H; ++h)
        std::copy(image + (c * s.H + h) * s.W, image + (c * s.H + h + 1) * s.W,
                  data.data() + (c * rows + h + s.ph) * stride + kLeft);
  }
};

// Rows per register tile: 24 accumulators (B · R · V) where the shape allows, 16 for 8
// channels over two vectors.
constexpr int rows_per_tile(int V, int B) { return V == 2 ? 1 : 24 / B; }

// Output rows oh0 .. oh0 + R − 1 (those below OH) of B channels of one image: V vectors of
// 16 positions per row. `out` is the first of the block's planes. The lanes past OW compute
// values no one stores.
template <int V, int B>
ADJOINT_AVX512 void tile(const DirectConvShape& s, const PaddedImage& in, const float* wb, int64_t oh0,
                         int64_t channels, float* out) {
  constexpr int R = rows_per_tile(V, B);
  __m512 acc[B][R * V];
#pragma GCC unroll 12
  for (int q = 0; q < B; ++q)
#pragma GCC unroll 3
    for (int k = 0; k < R * V; ++k) acc[q][k] = _mm512_setzero_ps();
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t i = 0; i < s.KH; ++i) {
      // Padded row oh + i is input row oh + i − ph.
      const float* row = in.data.data() + (c * in.rows + oh0 + i) * in.stride + kLeft - s.pw;
      const float* wt = wb + (c * s.KH + i) * s.KW * B;
      for (int64_t j = 0; j < s.KW; ++j) {
        __m512 x[R * V];
#pragma GCC unroll 3
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
          for (int v = 0; v < V; ++v) x[r * V + v] = _mm512_loadu_ps(row + r * in.stride + 16 * v + j);
        const float* wq = wt + j * B;
#pragma GCC unroll 12
        for (int q = 0; q < B; ++q) {
          const __m512 weight = _mm512_set1_ps(wq[q]);
#pragma GCC unroll 3
          for (int k = 0; k < R * V; ++k) acc[q][k] = _mm512_fmadd_ps(weight, x[k], acc[q][k]);
        }
      }
    }
  }
  // Constant indices into acc only (fully unrolled loops): an index known only at run time
  // would keep acc in memory, stored back on every FMA.
  const int64_t P = s.OH * s.OW;
  const int rows = static_cast<int>(std::min<int64_t>(R, s.OH - oh0));
#pragma GCC unroll 12
  for (int q = 0; q < B; ++q)
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v)
        if (q < channels && r < rows)
          _mm512_mask_storeu_ps(out + q * P + (oh0 + r) * s.OW + 16 * v, first_lanes(s.OW - 16 * v), acc[q][r * V + v]);
}

template <int B>
ADJOINT_AVX512 void run(const DirectConvShape& s, const float* x, const float* packed, float* y,
                        const std::function<void(float*, int64_t)>& finish) {
  const int64_t blocks = (s.O + B - 1) / B, P = s.OH * s.OW;
  const int64_t block_weights = s.C * s.KH * s.KW * B;
  const bool one_vector = s.OW <= 16;
  const int64_t tile_rows = rows_per_tile(one_vector ? 1 : 2, B);
  // One image per task: its padded copy is made once and read by every block of channels,
  // row tile after row tile (the rows a tile reads stay in L1 for the next blocks).
  parallel_for(s.N, 1, [&](int64_t n0, int64_t n1) {
    PaddedImage padded(s);
    for (int64_t n = n0; n < n1; ++n) {
      padded.fill(s, x + n * s.C * s.H * s.W);
      float* image_out = y + n * s.O * P;
      for (int64_t oh0 = 0; oh0 < s.OH; oh0 += tile_rows)
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t channels = std::min<int64_t>(B, s.O - b * B);
          if (one_vector)
            tile<1, B>(s, padded, packed + b * block_weights, oh0, channels, image_out + b * B * P);
          else
            tile<2, B>(s, padded, packed + b * block_weights, oh0, channels, image_out + b * B * P);
        }
      for (int64_t o = 0; o < s.O; ++o) finish(image_out + o * P, o);
    }
  });
}

}  // namespace

bool direct_conv_runs(const DirectConvShape& s) {
  // Measured on a Zen 5 core (ops/conv.cpp's choice): ahead of Winograd and im2col with up
  // to 32 input and output channels on maps 12 to 32 wide.
  return vector_isa() == VectorIsa::Avx512 && s.OW >= 12 && s.OW <= 32 && s.W <= kMaxWidth && s.pw < kLeft &&
         s.C <= 32 && s.O <= 32;
}

void direct_conv(const DirectConvShape& s, const float* x, const float* w, bool adjoint_of, float* y,
                 const std::function<void(float*, int64_t)>& finish) {
  check(direct_conv_runs(s), "direct_conv: not for this shape or CPU");
  if (s.N == 0 || s.O == 0) return;
  const int64_t block = block_size(s.O);
  const std::vector<float> packed = pack_weights(s, w, adjoint_of, block);
  if (block == 8)
    run<8>(s, x, packed.data(), y, finish);
  else
    run<kMaxBlock>(s, x, packed.data(), y, finish);
}

#else  // not x86-64: never runs

bool direct_conv_runs(const DirectConvShape&) { return false; }
void direct_conv(const DirectConvShape&, const float*, const float*, bool, float*,
                 const std::function<void(float*, int64_t)>&) {
  throw Error("direct_conv: not an x86-64 build");
}

#endif

}  // namespace adjoint
