#include "ops/conv/direct.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/error.h"
#include "engine/prefetch.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
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

// Weight entries packed per task: a deep layer's weights are megabytes, and packing them
// alone would leave the other threads idle while every image waits on them.
constexpr int64_t kPackGrain = 1 << 15;

// The weights in blocks of `block` output channels: packed[b][c][i][j][q] = weight of output
// channel b·block + q (zero past the last), input channel c, tap (i, j). Blocks in parallel,
// each written in order (every entry once, so the buffer needs no clearing first); a copy,
// the same at any thread count.
struct PackedWeights {
  std::unique_ptr<float[]> values;
  int64_t size;
};
std::shared_ptr<const PackedWeights> pack_weights(const DirectConvShape& s, const float* w, bool adjoint_of,
                                                  int64_t block) {
  const int64_t blocks = (s.O + block - 1) / block, taps = s.KH * s.KW, per_block = s.C * taps * block;
  auto packed_weights = std::make_shared<PackedWeights>(
      PackedWeights{std::unique_ptr<float[]>(new float[static_cast<size_t>(blocks * per_block)]), blocks * per_block});
  float* packed = packed_weights->values.get();
  parallel_for(blocks, std::max<int64_t>(1, kPackGrain / std::max<int64_t>(per_block, 1)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* to = packed + b * per_block;
      const int64_t channels = std::min(block, s.O - b * block);
      for (int64_t c = 0; c < s.C; ++c)
        for (int64_t tap = 0; tap < taps; ++tap, to += block) {
          // Flipped for the adjoint: tap (i, j) reads (KH − 1 − i, KW − 1 − j).
          for (int64_t q = 0; q < channels; ++q) {
            const int64_t o = b * block + q;
            to[q] = adjoint_of ? w[(c * s.O + o) * taps + taps - 1 - tap] : w[(o * s.C + c) * taps + tap];
          }
          std::fill(to + channels, to + block, 0.0f);
        }
    }
  });
  return packed_weights;
}

// pack_weights's blocks, kept by `kept` where it keeps forms.
std::shared_ptr<const PackedWeights> packed_weights(const DirectConvShape& s, const float* w, bool adjoint_of,
                                                    int64_t block, const conv::PreparedWeights& kept) {
  return kept.get<PackedWeights>(conv::WeightForm::Direct, {uint64_t(adjoint_of), uint64_t(block)}, [&] {
    auto packed = pack_weights(s, w, adjoint_of, block);
    return std::pair<std::shared_ptr<const PackedWeights>, int64_t>{packed, packed->size * int64_t(sizeof(float))};
  });
}

// One image, zero-padded: C planes of `rows` rows of `stride` floats; input row h is row
// ph + h, input column q is entry `left` + q; everything else is zero. Every load of a
// kernel then reads memory of this buffer, and zeros wherever the convolution reads padding.
// The buffer is the thread's, kept between calls: its zeros stay zeros while images of one
// layout are copied in, so it is cleared only when the layout changes (a fresh zeroed buffer
// per image costs page faults, a sizeable share of a narrow layer).
class PaddedImage {
 public:
  PaddedImage(const DirectConvShape& s, int64_t rows, int64_t stride, int64_t left)
      : rows(rows), stride(stride), left(left), s_(s), buffer_(thread_buffer()) {
    const Layout layout{s.C, s.H, s.W, s.ph, rows, stride, left};
    if (buffer_.layout == layout) return;
    buffer_.layout = layout;
    buffer_.data.assign(static_cast<size_t>(s.C * rows * stride), 0.0f);
  }
  // Copies an image in, row by row in vectors (rows are short: a library call per row
  // costs more than the copy).
  ADJOINT_AVX512 void fill(const float* image) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (s_.W % 16)) - 1u);
    for (int64_t c = 0; c < s_.C; ++c)
      for (int64_t h = 0; h < s_.H; ++h) {
        const float* from = image + (c * s_.H + h) * s_.W;
        float* to = buffer_.data.data() + (c * rows + h + s_.ph) * stride + left;
        int64_t q = 0;
        for (; q + 16 <= s_.W; q += 16) _mm512_storeu_ps(to + q, _mm512_loadu_ps(from + q));
        if (tail) _mm512_mask_storeu_ps(to + q, tail, _mm512_maskz_loadu_ps(tail, from + q));
      }
  }
  const float* data() const { return buffer_.data.data(); }

  const int64_t rows, stride, left;

 private:
  struct Layout {
    int64_t C, H, W, ph, rows, stride, left;
    bool operator==(const Layout&) const = default;
  };
  struct Buffer {
    Layout layout{};
    std::vector<float> data;
  };
  // Products never nest on a thread (a kernel starts no tasks), so one buffer per thread.
  static Buffer& thread_buffer() {
    thread_local Buffer buffer;
    return buffer;
  }
  const DirectConvShape& s_;
  Buffer& buffer_;
};

// The loop both kernels share: one image per task, copied into a padded image of `rows` ×
// `stride` (input column 0 at `left`) while the next is prefetched (without, the copies
// wait on memory), computed by
// compute(padded, output planes of the image), then finish(plane, o) on each output plane.
template <class Compute>
void for_each_image(const DirectConvShape& s, const float* x, float* y, int64_t rows, int64_t stride, int64_t left,
                    const std::function<void(float*, int64_t)>& finish, Compute compute) {
  const int64_t in_size = s.C * s.H * s.W, P = s.OH * s.OW;
  parallel_for(s.N, 1, [&](int64_t n0, int64_t n1) {
    PaddedImage padded(s, rows, stride, left);
    for (int64_t n = n0; n < n1; ++n) {
      if (n + 1 < s.N) prefetch(x + (n + 1) * in_size, in_size);
      padded.fill(x + n * in_size);
      float* image_out = y + n * s.O * P;
      compute(padded, image_out);
      for (int64_t o = 0; o < s.O; ++o) finish(image_out + o * P, o);
    }
  });
}

// ---------------------------------------------------------------------------------------
// By rows: output channels × one or two vectors of 16 positions per register tile.

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
      const float* row = in.data() + (c * in.rows + oh0 + i) * in.stride + in.left - s.pw;
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
ADJOINT_AVX512 void run_by_rows(const DirectConvShape& s, const float* x, const float* packed, float* y,
                                const std::function<void(float*, int64_t)>& finish) {
  const int64_t blocks = (s.O + B - 1) / B, P = s.OH * s.OW;
  const int64_t block_weights = s.C * s.KH * s.KW * B;
  const bool one_vector = s.OW <= 16;
  const int64_t tile_rows = rows_per_tile(one_vector ? 1 : 2, B);
  // Rows: all that the tiles read, the last tile's rows past OH included. Entries: kLeft
  // (aligned), the row, and 16 past the last vector's reach (whole vectors are loaded).
  const int64_t rows_read = (s.OH + tile_rows - 1) / tile_rows * tile_rows + s.KH - 1;
  // Row tile after row tile, every block of channels (the rows a tile reads stay in L1 for
  // the next blocks).
  for_each_image(s, x, y, rows_read, kLeft + (s.W + s.KW + 16 + 15) / 16 * 16, kLeft, finish,
                 [&](const PaddedImage& padded, float* image_out) {
                   for (int64_t oh0 = 0; oh0 < s.OH; oh0 += tile_rows)
                     for (int64_t b = 0; b < blocks; ++b) {
                       const int64_t channels = std::min<int64_t>(B, s.O - b * B);
                       float* out = image_out + b * B * P;
                       if (one_vector)
                         tile<1, B>(s, padded, packed + b * block_weights, oh0, channels, out);
                       else
                         tile<2, B>(s, padded, packed + b * block_weights, oh0, channels, out);
                     }
                 });
}

// ---------------------------------------------------------------------------------------
// By channels: positions × 32 output channels per register tile.

constexpr int64_t kChannelBlock = 32;
// Output positions ow0 .. ow0 + M − 1 of rows oh0 .. oh0 + R − 1 (R·M ≤ 14, 28 accumulators
// at most), channels b·32 .. b·32 + channels − 1 of one image at stride S. `wb`: the block's
// packed weights, [c][i][j][32]; `out`: the block's first output plane.
// GCC's predictive commoning would carry the broadcasts of one tap over to the next (tap
// j + 1 of position q reads what tap j of position q + 1 read) through the stack, spilling
// the accumulators: off here.
template <int M, int R, int S>
[[gnu::target("avx512f"), gnu::optimize("no-predictive-commoning")]] void channel_tile(const DirectConvShape& s, const PaddedImage& in, const float* wb, int64_t oh0,
                                 int64_t ow0, int64_t channels, float* out) {
  constexpr int T = M * R;  // positions: t = r·M + q
  __m512 acc[T][2];
#pragma GCC unroll 14
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < s.C; ++c)
    for (int64_t i = 0; i < s.KH; ++i) {
      const float* row = in.data() + (c * in.rows + oh0 * S + i) * in.stride + ow0 * S;
      const float* wt = wb + (c * s.KH + i) * s.KW * kChannelBlock;
      for (int64_t j = 0; j < s.KW; ++j) {
        const __m512 w0 = _mm512_loadu_ps(wt + j * kChannelBlock), w1 = _mm512_loadu_ps(wt + j * kChannelBlock + 16);
#pragma GCC unroll 14
        for (int t = 0; t < T; ++t) {
          const __m512 value = _mm512_set1_ps(row[(t / M) * S * in.stride + (t % M) * S + j]);
          acc[t][0] = _mm512_fmadd_ps(value, w0, acc[t][0]);
          acc[t][1] = _mm512_fmadd_ps(value, w1, acc[t][1]);
        }
      }
    }
  // acc[t] holds position t's channels; the planes want each channel's positions.
  alignas(64) float by_position[T][kChannelBlock];
#pragma GCC unroll 14
  for (int t = 0; t < T; ++t) {
    _mm512_store_ps(by_position[t], acc[t][0]);
    _mm512_store_ps(by_position[t] + 16, acc[t][1]);
  }
  const int64_t P = s.OH * s.OW;
  for (int64_t o = 0; o < channels; ++o)
    for (int r = 0; r < R; ++r) {
      float* to = out + o * P + (oh0 + r) * s.OW + ow0;
      for (int q = 0; q < M; ++q) to[q] = by_position[r * M + q][o];
    }
}

using ChannelTile = void (*)(const DirectConvShape&, const PaddedImage&, const float*, int64_t, int64_t, int64_t,
                             float*);

// The tile for M positions per row (M in kTileWidths) and R rows (1 to 3, R·M ≤ 14).
constexpr int kTileWidths[] = {14, 8, 7, 4, 2, 1};
template <int S>
ChannelTile channel_tile_for(int M, int R) {
  switch (M * 4 + R) {
    case 14 * 4 + 1: return channel_tile<14, 1, S>;
    case 8 * 4 + 1: return channel_tile<8, 1, S>;
    case 7 * 4 + 1: return channel_tile<7, 1, S>;
    case 7 * 4 + 2: return channel_tile<7, 2, S>;
    case 4 * 4 + 1: return channel_tile<4, 1, S>;
    case 4 * 4 + 2: return channel_tile<4, 2, S>;
    case 4 * 4 + 3: return channel_tile<4, 3, S>;
    case 2 * 4 + 1: return channel_tile<2, 1, S>;
    case 2 * 4 + 2: return channel_tile<2, 2, S>;
    case 2 * 4 + 3: return channel_tile<2, 3, S>;
    case 1 * 4 + 1: return channel_tile<1, 1, S>;
    case 1 * 4 + 2: return channel_tile<1, 2, S>;
    default: return channel_tile<1, 3, S>;
  }
}

// Every output position of a block of channels: rows in groups of up to three where a row
// holds few positions, spread evenly (a 4×4 map as two tiles of 4 × 2 positions rather than
// 4 × 3 and a 4 × 1 with 8 accumulators), each row in chunks of the widest tile that fits.
template <int S>
void channel_block(const DirectConvShape& s, const PaddedImage& in, const float* wb, int64_t channels, float* out) {
  for (int64_t oh0 = 0; oh0 < s.OH;) {
    int64_t rows = 1;
    for (int64_t ow0 = 0; ow0 < s.OW;) {
      int M = 1;
      for (int width : kTileWidths)
        if (width <= s.OW - ow0) {
          M = width;
          break;
        }
      // The first chunk of the row decides how many rows go together (every chunk agrees:
      // chunks after the first are never wider).
      if (ow0 == 0) {  // as many rows as fit, spread evenly (a 4-row map as 2 + 2, not 3 + 1)
        const int64_t most = std::min<int64_t>(3, 14 / M), left = s.OH - oh0;
        const int64_t groups = (left + most - 1) / most;
        rows = (left + groups - 1) / groups;
      }
      channel_tile_for<S>(M, static_cast<int>(std::min<int64_t>(rows, 14 / M)))(s, in, wb, oh0, ow0, channels, out);
      ow0 += M;
    }
    oh0 += rows;
  }
}

ADJOINT_AVX512 void run_by_channels(const DirectConvShape& s, const float* x, const float* packed, float* y,
                                    const std::function<void(float*, int64_t)>& finish) {
  const int64_t blocks = (s.O + kChannelBlock - 1) / kChannelBlock, P = s.OH * s.OW;
  const int64_t block_weights = s.C * s.KH * s.KW * kChannelBlock;
  // Rows and entries: all that the tiles read, (OH − 1)·sh + KH by (OW − 1)·sw + KW, and all
  // of the input (a strided layer may read less than all).
  const int64_t rows = std::max((s.OH - 1) * s.sh + s.KH, s.ph + s.H);
  const int64_t stride = std::max((s.OW - 1) * s.sw + s.KW, s.pw + s.W);
  for_each_image(s, x, y, rows, stride, s.pw, finish, [&](const PaddedImage& padded, float* image_out) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t channels = std::min(kChannelBlock, s.O - b * kChannelBlock);
      float* out = image_out + b * kChannelBlock * P;
      if (s.sw == 1)
        channel_block<1>(s, padded, packed + b * block_weights, channels, out);
      else
        channel_block<2>(s, padded, packed + b * block_weights, channels, out);
    }
  });
}

// A thread's padded copy of one image stays within 16 MiB (deep layers on large images go
// to the GEMM algorithms instead).
bool padded_image_fits(const DirectConvShape& s) {
  return s.C * (s.H + 2 * s.ph + s.KH + 2) * (s.W + 2 * s.pw + s.KW + 32) <= (int64_t(1) << 22);
}

bool by_rows_suits(const DirectConvShape& s) {
  return s.sh == 1 && s.sw == 1 && s.OW >= 12 && s.OW <= 32 && s.W <= kMaxWidth && s.pw < kLeft && s.C <= 32 &&
         s.O <= 32;
}

// By channels reads all of a layer's weights once per image. Beyond this many bytes they
// no longer stay in the L2 cache from one image to the next and stream from memory for every
// image, for few positions where the map is small; im2col's GEMM reads its packed weights
// once per block of images instead.
constexpr int64_t kByChannelsWeightBytes = 8 << 20;

// Where the by-channels kernel is ahead of Winograd and im2col with the engine's GEMM, with
// weights of up to kByChannelsWeightBytes: on every strided 3×3 layer (a strided layer is no
// Winograd case, and im2col copies the input kh·kw times), on maps up to 8 wide with up to
// 128 input channels, and, ahead of the by-rows kernel too, on maps up to 16 wide with up to
// 32 (every lane computes a position there, against 14 of 16 by rows). Behind where
// Winograd's 2.25× fewer multiplications meet enough channels to keep the GEMMs efficient,
// and on 1×1 layers (im2col is a plain GEMM there).
bool by_channels_suits(const DirectConvShape& s) {
  if (s.sh != s.sw || s.sw > 2 || s.O % kChannelBlock != 0 || s.KH * s.KW == 1) return false;
  if (!padded_image_fits(s)) return false;
  if (s.C * s.O * s.KH * s.KW * int64_t(sizeof(float)) > kByChannelsWeightBytes) return false;
  return s.sw == 2 || (s.OW <= 8 && s.C <= 128) || (s.OW <= 16 && s.C <= 32);
}

}  // namespace

bool direct_conv_runs(const DirectConvShape& s) {
  // Ahead of Winograd and im2col (ops/conv.cpp's choice) by rows with up to 32 input and
  // output channels on maps 12 to 32 wide; by channels as by_channels_suits says.
  return vector_isa() == VectorIsa::Avx512 && (by_rows_suits(s) || by_channels_suits(s));
}

void direct_conv(const DirectConvShape& s, const float* x, const float* w, bool adjoint_of, float* y,
                 const std::function<void(float*, int64_t)>& finish, const conv::PreparedWeights& kept) {
  check(direct_conv_runs(s), "direct_conv: not for this shape or CPU");
  if (s.N == 0 || s.O == 0) return;
  if (by_channels_suits(s)) {  // where both suit, by channels is ahead (see its rule)
    const auto packed = packed_weights(s, w, adjoint_of, kChannelBlock, kept);
    return run_by_channels(s, x, packed->values.get(), y, finish);
  }
  const int64_t block = block_size(s.O);
  const auto packed = packed_weights(s, w, adjoint_of, block, kept);
  if (block == 8)
    run_by_rows<8>(s, x, packed->values.get(), y, finish);
  else
    run_by_rows<kMaxBlock>(s, x, packed->values.get(), y, finish);
}

#else  // not x86-64: never runs

bool direct_conv_runs(const DirectConvShape&) { return false; }
void direct_conv(const DirectConvShape&, const float*, const float*, bool, float*,
                 const std::function<void(float*, int64_t)>&, const conv::PreparedWeights&) {
  throw Error("direct_conv: not an x86-64 build");
}

#endif

}  // namespace adjoint
