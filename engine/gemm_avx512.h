// The engine's own single-precision GEMM for CPUs with AVX-512, on the calling thread:
// C = alpha · op(A) · op(B) + beta · C, row-major, as gemm_serial (engine/gemm.h).
//
// Why the engine has one beside OpenBLAS: the convolutions' PyTorch peer runs oneDNN's
// AVX-512 kernels whatever OpenBLAS kernel family is chosen, while an environment may hold
// OpenBLAS to its AVX2 kernels (OPENBLAS_CORETYPE=Haswell), half the rate on such a CPU.
// engine/gemm.cpp sends the convolutions' products here (GemmKernel::widest); every other
// product stays with OpenBLAS, which both sides of a benchmark share.
//
// The method is the one of BLIS and OpenBLAS (Goto & van de Geijn, "Anatomy of
// high-performance matrix multiplication", 2008): op(B) is packed in blocks of kKc rows ×
// kNc columns, cut into panels of kNr columns; op(A) in blocks of kMc rows, cut into panels
// of kMr rows; a register tile of kMr × kNr sums of C (24 of the 32 vector registers) runs
// over a block's depth. Every element of C is summed in the same order (depth blocks of kKc,
// in order; within one, k in order, one FMA each), wherever its tile lies: the same bits for
// any split of C into panels, so at any thread count.
#pragma once
#include <algorithm>
#include <cstdint>

#include "engine/gemm.h"

namespace adjoint {

// Whether avx512_gemm runs here: the CPU has AVX-512 and run_widest's cap allows it.
bool avx512_gemm_available();

// `packed_a`: op(A) as avx512_pack_a wrote it, or null to pack it here (A is then read).
// `packed_b`: op(B) as avx512_pack_b wrote it for these N and K, or null to pack it here.
// An epilogue's start terms replace beta · C: C = alpha · op(A) · op(B) + residual + bias;
// its map then runs over each finished row of C (GemmEpilogue).
void avx512_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                 const float* packed_a = nullptr, const GemmEpilogue& epilogue = {}, const float* packed_b = nullptr);

// The layout of op(A) packed whole, for products that share it (a convolution's weights meet
// every tile of a batch): depth block after depth block of kAvx512DepthBlock, each its panels
// of kAvx512PanelRows rows in order. The panel of rows i .. i + kAvx512PanelRows (i a multiple
// of it) at depths k0 .. k0 + kc (k0 a multiple of kAvx512DepthBlock, kc = min(kAvx512DepthBlock,
// K − k0)) starts at avx512_packed_a_panel(M, K, i, k0) and holds entry (i + r, k0 + k) at
// [k · kAvx512PanelRows + r]; rows past M are zero. A caller may compute op(A) straight into
// this layout (Winograd's transform of the weights, ops/conv.cpp) rather than pack a matrix.
constexpr int64_t kAvx512PanelRows = 12;
constexpr int64_t kAvx512DepthBlock = 256;
inline int64_t avx512_padded_rows(int64_t M) { return (M + kAvx512PanelRows - 1) / kAvx512PanelRows * kAvx512PanelRows; }
inline int64_t avx512_packed_a_size(int64_t M, int64_t K) { return avx512_padded_rows(M) * K; }
inline int64_t avx512_packed_a_panel(int64_t M, int64_t K, int64_t i, int64_t k0) {
  return k0 * avx512_padded_rows(M) + i * std::min(kAvx512DepthBlock, K - k0);
}

// op(A) packed whole: avx512_packed_a_size(M, K) floats at `out`.
void avx512_pack_a(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda, float* out);

// The layout of op(B) packed whole, for products that share it (a linear layer's weights meet
// every batch): depth block after depth block of kAvx512DepthBlock, each its panels of
// kAvx512PanelCols columns in order. The panel of columns j .. j + kAvx512PanelCols (j a
// multiple of it) at depths k0 .. k0 + kc starts at avx512_packed_b_panel(N, K, j, k0) and
// holds entry (k0 + k, j + c) at [k · kAvx512PanelCols + c]; columns past N are zero. `out`
// must be 64-byte aligned (the kernel loads the panels aligned).
constexpr int64_t kAvx512PanelCols = 32;
inline int64_t avx512_padded_cols(int64_t N) {
  return (N + kAvx512PanelCols - 1) / kAvx512PanelCols * kAvx512PanelCols;
}
inline int64_t avx512_packed_b_size(int64_t N, int64_t K) { return avx512_padded_cols(N) * K; }
inline int64_t avx512_packed_b_panel(int64_t N, int64_t K, int64_t j, int64_t k0) {
  return k0 * avx512_padded_cols(N) + j * std::min(kAvx512DepthBlock, K - k0);
}

// op(B) (K × N) packed whole: avx512_packed_b_size(N, K) floats at `out`.
void avx512_pack_b(bool trans_b, int64_t N, int64_t K, const float* B, int64_t ldb, float* out);

}  // namespace adjoint
