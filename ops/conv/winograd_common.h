// What Winograd's two tile sizes share (ops/conv/winograd.h: F(2×2, 3×3), 16 transform
// positions; ops/conv/winograd_f4.h: F(4×4, 3×3), 36): where the transform-domain slices
// lie, how a batch is cut into blocks and bands of tiles, the products of a band, and the
// weights in the transform domain, written straight into the GEMM's packed layout.
//
// A kernel transform is a type with `kSlices` (its transform positions) and
// `apply(k, u)`: u = (G k Gᵀ) in position order for a 3×3 kernel k (row-major), with T a
// float or a vector holding one kernel per lane (the same operations, so the same bits).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/threads.h"
#include "ops/conv/geometry.h"
#include "ops/conv/prepared_weights.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint::conv {

// The transform-domain matrices of U, V and M lie one after the other, `winograd_slice_stride`
// floats apart: padded by a cache line, since matrices a power of two apart would put the
// write streams of a transform into one cache set, which thrashes.
inline int64_t winograd_slice_stride(int64_t rows, int64_t cols) { return rows * cols + 16; }

// How the batch is cut for Winograd: blocks of images of few tiles, or one image in bands
// of tile rows; about `target` tiles per GEMM.
struct WinogradTiling {
  int64_t N, block, band_rows, TH, TW;
  int64_t blocks() const { return (N + block - 1) / block; }
  int64_t images_in(int64_t k) const { return std::min(block, N - k * block); }
};

// The tiling for tiles of `tile` × `tile` outputs with `slices` transform positions: a
// tile holds slices·C values of V and slices·O of M; a block's stay near `bytes`, with at
// least `min_tiles` tiles (and at most kMaxColumns) per product.
inline WinogradTiling winograd_tiling(const ConvGeometry& g, int64_t tile, int64_t slices, int64_t bytes,
                                      int64_t min_tiles) {
  WinogradTiling t{g.N, 1, 0, (g.OH + tile - 1) / tile, (g.OW + tile - 1) / tile};
  const int64_t target =
      std::clamp<int64_t>(bytes / (slices * int64_t(sizeof(float)) * (g.C + g.O)), min_tiles, kMaxColumns);
  const int64_t per_image = t.TH * t.TW;
  t.band_rows = t.TH;
  if (per_image >= target) {
    const int64_t rows = std::clamp<int64_t>((target + t.TW / 2) / t.TW, 1, t.TH);
    const int64_t bands = (t.TH + rows - 1) / rows;
    t.band_rows = (t.TH + bands - 1) / bands;
  } else {
    const int64_t block = std::clamp<int64_t>((target + per_image - 1) / per_image, 1, std::max<int64_t>(g.N, 1));
    t.block = balanced_block(g.N, block);
  }
  return t;
}

// Runs body(xi) for the `slices` products of a band, one per transform position. With few
// image blocks (ConvGemm not serial) a product of a small map is often too narrow for gemm
// to split, so the products run side by side instead; each writes its own slice, by the
// same kernel either way, so the bits do not depend on the thread count.
inline void for_each_slice(const ConvGemm& product, int slices, const std::function<void(int)>& body) {
  if (product.serial) {
    for (int xi = 0; xi < slices; ++xi) body(xi);
    return;
  }
  parallel_for(slices, 1, [&](int64_t x0, int64_t x1) {
    for (int64_t xi = x0; xi < x1; ++xi) body(static_cast<int>(xi));
  });
}

// Panels p0 .. p1 (rows p·kAvx512PanelRows onwards) at depths k0 .. k1 of the slices of U
// (or Uᵀ) in the AVX-512 kernels' packed layout (slices `stride` floats apart), entry (i, k)
// from the kernel at w + i·row_step + k·depth_step. A panel's kernels at one depth are
// loaded a kernel a vector and transposed, so that tap t of every row lies in one vector
// (the panel's rows in its lanes); every slice's entries at that depth are then one store
// of consecutive floats. The pass is bound by memory: it writes slices/9 of the weights (at
// batch 1 on a small map, it is most of a wide layer's time). The loops run along w's
// memory: Uᵀ's rows are w's input channels, so its panels are the inner loop (panel by
// panel, each read 12 kernels of every output channel, and a 512-channel layer's weights
// passed through the cache 43 times).
#if defined(__x86_64__)
template <class Transform>
ADJOINT_AVX512 void winograd_transform_packed(const float* w, int64_t row_step, int64_t depth_step, int64_t M,
                                              int64_t K, int64_t p0, int64_t p1, int64_t k0, int64_t k1, float* u,
                                              int64_t stride) {
  const __mmask16 panel = first_lanes(kAvx512PanelRows), nine = first_lanes(9);
  const bool panels_inner = row_step < depth_step;
  const int64_t outer_end = panels_inner ? k1 : p1, inner_end = panels_inner ? p1 : k1;
  for (int64_t outer = panels_inner ? k0 : p0; outer < outer_end; ++outer)
    for (int64_t inner = panels_inner ? p0 : k0; inner < inner_end; ++inner) {
      const int64_t i0 = (panels_inner ? inner : outer) * kAvx512PanelRows, k = panels_inner ? outer : inner;
      const int64_t block = k / kAvx512DepthBlock * kAvx512DepthBlock;
      float* out = u + avx512_packed_a_panel(M, K, i0, block) + (k - block) * kAvx512PanelRows;
      const int64_t rows = std::min(kAvx512PanelRows, M - i0);
      const float* kernels = w + i0 * row_step + k * depth_step;
      __m512 taps[16], v[Transform::kSlices];  // row r's kernel, then (transposed) tap t of every row; rows past M stay zero
      for (int64_t r = 0; r < 16; ++r)
        taps[r] = r < rows ? _mm512_maskz_loadu_ps(nine, kernels + r * row_step) : _mm512_setzero_ps();
      transpose16(taps);
      Transform::apply(taps, v);
      for (int xi = 0; xi < Transform::kSlices; ++xi) _mm512_mask_storeu_ps(out + xi * stride, panel, v[xi]);
    }
}
#else
template <class Transform>
void winograd_transform_packed(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                               float*, int64_t) {
  throw Error("winograd_transform_packed: not an x86-64 build");  // never called: no AVX-512 kernels
}
#endif

// U[ξ] (O × C, U[ξ][o][c] = (G w[o][c] Gᵀ)[ξ]) for the forward products, or its transpose
// Uᵀ[ξ] (C × O) for the input gradient's, ready for the products of a pass. Where the
// AVX-512 kernels run them, the transform writes their packed layout directly: one pass
// over memory, where a transform and then a pack made three (a deep layer on a small map
// reads its weights for few tiles, so preparing them weighs as much as the products).
// Elsewhere it writes plain matrices for OpenBLAS.
template <class Transform>
class WinogradWeights {
 public:
  static constexpr int kSlices = Transform::kSlices;
  WinogradWeights(const ConvGeometry& g, const float* w, bool transposed)
      : M_(transposed ? g.C : g.O),
        K_(transposed ? g.O : g.C),
        packs_(avx512_gemm_available()),
        // The slices one after the other, a cache line apart beyond their size (winograd_slice_stride).
        stride_((packs_ ? avx512_packed_a_size(M_, K_) : M_ * K_) + 16),
        storage_(kSlices * stride_) {
    float* u = storage_.data();
    // Entry (i, k) of a slice comes from kernel w[o][c]: (o, c) = (i, k), transposed (k, i).
    const int64_t row_step = 9 * (transposed ? 1 : g.C), depth_step = 9 * (transposed ? g.C : 1);
    if (packs_)
      transform_packed(w, row_step, depth_step, u);
    else
      transform_plain(w, row_step, depth_step, u);
    slices_.reserve(kSlices);
    for (int64_t xi = 0; xi < kSlices; ++xi)
      slices_.push_back(packs_ ? PackedA(M_, K_, u + xi * stride_)
                               : PackedA(false, M_, K_, u + xi * stride_, K_, GemmKernel::blas));
  }
  const PackedA& operator[](int xi) const { return slices_[static_cast<size_t>(xi)]; }
  int64_t bytes() const { return kSlices * stride_ * int64_t(sizeof(float)); }

 private:
  void transform_plain(const float* w, int64_t row_step, int64_t depth_step, float* u) const {
    parallel_for(M_, std::max<int64_t>(1, 1024 / K_), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t k = 0; k < K_; ++k) {
          float taps[9], v[kSlices];
          std::copy(w + i * row_step + k * depth_step, w + i * row_step + k * depth_step + 9, taps);
          Transform::apply(taps, v);
          for (int64_t xi = 0; xi < kSlices; ++xi) u[xi * stride_ + i * K_ + k] = v[xi];
        }
    });
  }

  void transform_packed(const float* w, int64_t row_step, int64_t depth_step, float* u) const {
    const int64_t panels = avx512_padded_rows(M_) / kAvx512PanelRows;
    if (row_step < depth_step)  // split along the depth, the outer loop (winograd_transform_packed)
      parallel_for(K_, std::max<int64_t>(1, 256 / panels), [&](int64_t k0, int64_t k1) {
        winograd_transform_packed<Transform>(w, row_step, depth_step, M_, K_, 0, panels, k0, k1, u, stride_);
      });
    else
      parallel_for(panels, std::max<int64_t>(1, 256 / K_), [&](int64_t p0, int64_t p1) {
        winograd_transform_packed<Transform>(w, row_step, depth_step, M_, K_, p0, p1, 0, K_, u, stride_);
      });
  }
  int64_t M_, K_;
  bool packs_;
  int64_t stride_;
  Scratch storage_;
  std::vector<PackedA> slices_;
};

// U (or Uᵀ) of the weights w, of kind `form` (Winograd, or WinogradFlipped where w are a
// convolution's weights transposed and flipped for its input gradient), kept by `kept` where
// it keeps forms.
template <class Transform>
std::shared_ptr<const WinogradWeights<Transform>> winograd_weights(const ConvGeometry& g, const float* w,
                                                                   bool transposed, WeightForm form,
                                                                   const PreparedWeights& kept) {
  using Weights = WinogradWeights<Transform>;
  return kept.get<Weights>(form, {uint64_t(Transform::kSlices), uint64_t(transposed), uint64_t(avx512_gemm_available())},
                           [&] {
                             auto u = std::make_shared<const Weights>(g, w, transposed);
                             return std::pair<std::shared_ptr<const Weights>, int64_t>{u, u->bytes()};
                           });
}

}  // namespace adjoint::conv
