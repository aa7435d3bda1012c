// What the convolution algorithms of ops/conv.cpp share: the extents of one convolution
// (ConvGeometry), what the forward pass does to each output as it writes it (Epilogue), a
// pool of scratch buffers kept between calls (Scratch), the GEMM call every product goes
// through (ConvGemm), and the fixed-order sums of the backward passes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/gemm.h"
#include "engine/tensor.h"
#include "engine/threads.h"
#include "ops/conv.h"

namespace adjoint::conv {

// The most output columns (im2col) or tiles (Winograd) one GEMM covers: wider products
// gain no rate and their operands leave the L2 cache.
constexpr int64_t kMaxColumns = 1024;
// The weight gradient is summed over image blocks in chunks of consecutive blocks, one
// partial sum per chunk, added in chunk order: deterministic, and parallel up to this many.
constexpr int64_t kMaxPartials = 8;
// Elements copied per task in the im2col/col2im/gather loops.
constexpr int64_t kCopyGrain = 1 << 15;

// Blocks of about `block` images for a batch of N: as many blocks as that size makes, but
// equal to within an image (8 images in blocks of 6 would run as 6 and 2, one thread
// finishing long before the other; as 4 and 4 they take the same time), and an even number
// of them where there are several (8 images in blocks of 3 would run as 3, 3 and 2, one
// thread taking two blocks while the other takes one; as four blocks of 2, two threads
// share them evenly). The blocks depend on N and `block` only, never on the thread count.
inline int64_t balanced_block(int64_t N, int64_t block) {
  if (N <= 0 || block <= 0) return std::max<int64_t>(block, 1);
  int64_t blocks = (N + block - 1) / block;
  if (blocks > 1 && blocks % 2 == 1 && blocks < N) ++blocks;
  return (N + blocks - 1) / blocks;
}

// Every extent of one convolution.
struct ConvGeometry {
  int64_t N, C, H, W;  // input
  int64_t O, KH, KW;   // weight (O, C/groups, KH, KW)
  int64_t OH, OW;      // output
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, Cg, Og;  // groups, input and output channels per group
  int64_t P;               // OH·OW: output positions per image
  int64_t rows;            // C·KH·KW: rows of the column matrix
  int64_t rows_g;          // Cg·KH·KW: the GEMM reduction per group
  bool pointwise;          // 1×1, stride 1, no padding: an image is its own column matrix
  bool flat;               // stride 1 and OW == W: an im2col row is one shifted copy of a plane
};

// The extents of x * w under `o`, every shape and option checked.
ConvGeometry make_geometry(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o);

// What the forward pass does to each output value of channel o as it writes it: + bias[o];
// then, with eval-mode BatchNorm fused in (conv2d_batch_norm_eval), ·scale[o] + shift[o];
// then, with a residual, + the residual's value at the same place; then, with a fused ReLU,
// max(·, 0). These are the float operations of the separate ops in their order, so a fused
// output is bitwise the unfused one.
struct Epilogue {
  const float* bias = nullptr;
  const float* scale = nullptr;  // with shift, or neither
  const float* shift = nullptr;
  // A tensor of the output's shape, and the output's data, by which a row of the output
  // finds its residual. Only for algorithms that finish rows in place in the output
  // (im2col, direct), never a staging copy.
  const float* residual = nullptr;
  const float* output = nullptr;
  bool relu = false;

  // Anything beyond the bias (which the GEMMs may add themselves).
  bool after_bias() const { return scale != nullptr || residual != nullptr || relu; }
  // The steps after the bias on n values of channel o, in place. One branch-free loop per
  // case, so that each vectorises (std::max keeps a NaN, as ReLU does).
  void finish_row(float* __restrict row, int64_t n, int64_t o) const {
    if (residual) return finish_with_residual(row, n, o, residual + (row - output));
    if (scale) {
      const float k = scale[o], s = shift[o];
      if (relu)
        for (int64_t i = 0; i < n; ++i) row[i] = std::max(row[i] * k + s, 0.0f);
      else
        for (int64_t i = 0; i < n; ++i) row[i] = row[i] * k + s;
    } else if (relu) {
      for (int64_t i = 0; i < n; ++i) row[i] = std::max(row[i], 0.0f);
    }
  }

 private:
  void finish_with_residual(float* __restrict row, int64_t n, int64_t o, const float* __restrict r) const {
    const float k = scale ? scale[o] : 1.0f, s = shift ? shift[o] : 0.0f;
    if (scale && relu)
      for (int64_t i = 0; i < n; ++i) row[i] = std::max((row[i] * k + s) + r[i], 0.0f);
    else if (scale)
      for (int64_t i = 0; i < n; ++i) row[i] = (row[i] * k + s) + r[i];
    else if (relu)
      for (int64_t i = 0; i < n; ++i) row[i] = std::max(row[i] + r[i], 0.0f);
    else
      for (int64_t i = 0; i < n; ++i) row[i] = row[i] + r[i];
  }
};

// Scratch memory for column matrices, kept between calls: a fresh multi-megabyte buffer
// is page-faulted in on first touch, a sizeable cost next to a small layer's GEMM. Each
// buffer serves one image block at a time (not thread_local: a thread waiting in a nested
// parallel loop may start a second block).
class Scratch {
 public:
  explicit Scratch(int64_t n) {
    if (n > 0) buffer_ = take(static_cast<size_t>(n));
  }
  ~Scratch() {
    if (buffer_) give(std::move(buffer_));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() { return buffer_ ? buffer_->data() : nullptr; }

 private:
  using Buffer = std::unique_ptr<std::vector<float>>;
  // The smallest pooled buffer that fits, else a new one.
  static Buffer take(size_t n);
  // Back to the pool; beyond its limits the smallest buffers go (too many) or the largest (too big).
  static void give(Buffer b);
  Buffer buffer_;
};

// The GEMM for the products of `blocks` image blocks: with enough blocks to keep every thread
// busy, each product runs on its block's thread; with few, each is split across threads
// (gemm.h: the results are the same bits either way). The widest kernels the CPU has, as
// oneDNN's convolutions run (GemmKernel).
struct ConvGemm {
  bool serial;
  explicit ConvGemm(int64_t blocks) : serial(blocks >= 2 * num_threads()) {}
  void operator()(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
    if (serial)
      gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, GemmKernel::widest);
    else
      gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, GemmKernel::widest);
  }
  void operator()(const PackedA& a, bool tb, int64_t N, float alpha, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) const {
    if (serial)
      gemm_serial(a, tb, N, alpha, B, ldb, beta, C, ldc);
    else
      gemm(a, tb, N, alpha, B, ldb, beta, C, ldc);
  }
};

// Σ v[0..n) in double: eight running sums (element i to sum i mod 8, a form the compiler
// vectorises), added up at the end. A fixed order: the same bits at any thread count.
double row_sum(const float* v, int64_t n);

}  // namespace adjoint::conv
