// Row-major single-precision GEMM: C = alpha · op(A) · op(B) + beta · C, with op(A) M×K,
// op(B) K×N. When several threads run, a large product is split into column (or row)
// panels chosen from its shape, each a single-threaded cblas_sgemm run as a TBB task;
// OpenBLAS never starts threads of its own. Split or not, every element of C is summed in
// the same order (panels are multiples of the kernels' register tile and stay above
// OpenBLAS's small-matrix path), so results are bitwise the same at any thread count.
#pragma once
#include <cstdint>
#include <memory>

namespace adjoint {

// Which kernels run a product. `blas`: OpenBLAS's, the family blas_kernels() names. `widest`:
// the engine's own AVX-512 kernel (engine/gemm_avx512.h) where the CPU has AVX-512 and
// run_widest is not capped below it, else OpenBLAS's. The convolutions take `widest`, since
// their PyTorch peer runs oneDNN's AVX-512 kernels whatever OpenBLAS's family; every other
// product takes `blas`, the kernels both sides of a benchmark share.
enum class GemmKernel { blas, widest };

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, GemmKernel kernel = GemmKernel::blas);

// What a product starts its sums from in place of beta · C: an affine layer's bias (N
// values, one per column of C) and a residual connection (M × N, leading dimension ldr),
// each optional. The AVX-512 kernels add them while a tile of C is in registers, where
// OpenBLAS needs C filled with them by a pass of its own first.
//
// `map`, optional, runs over C's values once they are final, a row segment at a time, writing
// map(C) at `mapped` (leading dimension ldm; it may be C itself): an activation after an
// affine layer, applied while the rows are in cache rather than by another pass over memory.
// It is elementwise, so where it runs does not change its bits.
struct GemmEpilogue {
  using RowMap = void (*)(const float* values, float* out, int64_t count);
  const float* bias = nullptr;
  const float* residual = nullptr;
  int64_t ldr = 0;
  RowMap map = nullptr;
  float* mapped = nullptr;
  int64_t ldm = 0;
  // Whether C starts from beta · C (no bias, no residual).
  bool empty() const { return bias == nullptr && residual == nullptr; }
  // The epilogue of the block of C that starts at row i, column j.
  GemmEpilogue at(int64_t i, int64_t j) const {
    return {bias ? bias + j : nullptr, residual ? residual + i * ldr + j : nullptr, ldr,
            map,  mapped ? mapped + i * ldm + j : nullptr,  ldm};
  }
};

// C = alpha · op(A) · op(B) + residual + bias (C is not read, and must not overlap the
// residual), then the epilogue's map. With `widest` on a CPU that runs the AVX-512 kernels the
// epilogue folds into the product; otherwise C is filled with residual + bias, the product
// accumulates onto it and the map runs after. Either way residual + bias is one float sum, so
// both give the bits of that fill followed by the product with beta = 1 on the same kernels;
// the same at any thread count.
void gemm_with_epilogue(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, const GemmEpilogue& epilogue, float* C,
                        int64_t ldc, GemmKernel kernel);

// As gemm, on the calling thread only: for callers that already run their products in
// parallel (conv2d over image blocks), where splitting again would only repack operands.
void gemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                 GemmKernel kernel = GemmKernel::blas);

// op(A) of products that share it, packed once for the kernels that will run them: a
// convolution's weights meet every tile of a batch. With OpenBLAS's kernels (which pack
// inside every call) it only remembers where A is. A must outlive it.
class PackedA {
 public:
  PackedA(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda, GemmKernel kernel);
  // op(A) that its caller computed straight into the AVX-512 kernels' packed layout
  // (avx512_packed_a_panel, engine/gemm_avx512.h) at `packed`, which must outlive it.
  PackedA(int64_t M, int64_t K, const float* packed);
  int64_t rows() const { return M_; }
  int64_t depth() const { return K_; }

 private:
  friend void gemm_serial(const PackedA&, bool, int64_t, float, const float*, int64_t, float, float*, int64_t);
  friend void gemm(const PackedA&, bool, int64_t, float, const float*, int64_t, float, float*, int64_t);
  bool trans_a_ = false;
  int64_t M_, K_;
  const float* A_ = nullptr;
  int64_t lda_ = 0;
  std::unique_ptr<float[]> owned_;  // the packing this made itself (not zeroed: all written)
  const float* packed_ = nullptr;   // null: OpenBLAS's kernels run the products
};

// C = alpha · op(A) · op(B) + beta · C for a packed op(A) (M × K) and op(B) K × N: on the
// calling thread, or split into column panels across threads (the same bits either way).
void gemm_serial(const PackedA& a, bool trans_b, int64_t N, float alpha, const float* B, int64_t ldb, float beta,
                 float* C, int64_t ldc);
void gemm(const PackedA& a, bool trans_b, int64_t N, float alpha, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// op(B) (K × N) of products that share it, packed once for the AVX-512 kernels
// (avx512_packed_b_panel): a linear layer's weights meet every batch until they change, so
// ops/matmul.cpp keeps this with them (Tensor::prepared) and the products pack only the
// activations. Only where avx512_gemm_available(). B may go once this is made.
class PackedB {
 public:
  PackedB(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb);
  int64_t depth() const { return K_; }
  int64_t cols() const { return N_; }
  int64_t bytes() const;

 private:
  friend void gemm_with_epilogue(int64_t, float, const float*, int64_t, const PackedB&, const GemmEpilogue&, float*,
                                 int64_t);
  struct Free {
    void operator()(float* p) const;
  };
  int64_t K_, N_;
  std::unique_ptr<float, Free> packed_;
};

// C (M × N) = alpha · A · op(B) + residual + bias, then the epilogue's map, for A (M × K,
// leading dimension lda) and a packed op(B), on the AVX-512 kernels: split into row panels
// across threads (each reads the one packed op(B)); the bits of gemm_with_epilogue with
// `widest` on op(B) unpacked, at any thread count.
void gemm_with_epilogue(int64_t M, float alpha, const float* A, int64_t lda, const PackedB& b,
                        const GemmEpilogue& epilogue, float* C, int64_t ldc);

// Where matrix b of a batch starts, in elements from the base pointer:
//   (b / inner_count) · outer + (b % inner_count) · inner.
// With inner_count = 1 it is a plain fixed stride. Two levels address matrices that are not
// evenly spaced, such as head h of example n inside a packed (batch, tokens, 3, heads, dh)
// tensor: outer = tokens·3·heads·dh, inner_count = heads, inner = dh (rows 3·heads·dh apart).
struct BatchStrides {
  int64_t outer = 0;
  int64_t inner_count = 1;
  int64_t inner = 0;
  BatchStrides(int64_t stride = 0) : outer(stride) {}  // NOLINT: a single stride converts
  BatchStrides(int64_t outer_, int64_t inner_count_, int64_t inner_)
      : outer(outer_), inner_count(inner_count_), inner(inner_) {}
  int64_t at(int64_t b) const { return (b / inner_count) * outer + (b % inner_count) * inner; }
};

// Batched: `count` independent products, matrix b of A at A + stride_a.at(b) (likewise B, C).
// Parallel over the batch when each product is small, over panels when each is large.
void gemm_batched(int64_t count, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, BatchStrides stride_a, const float* B, int64_t ldb,
                  BatchStrides stride_b, float beta, float* C, int64_t ldc, BatchStrides stride_c);

// The kernels that run GemmKernel::widest products here: "adjoint AVX-512" or blas_kernels().
const char* widest_gemm_kernels();

// Measures, while alive, the CPU time that threads spend inside OpenBLAS's sgemm, summed
// over threads. Those are the kernels both sides of a benchmark share (GemmKernel::blas), so
// `adjoint bench models` sets a step's time in them beside the peer's whole step: the ratio
// the engine would reach if everything else cost nothing. One meter at a time.
class BlasTime {
 public:
  BlasTime();
  ~BlasTime();
  BlasTime(const BlasTime&) = delete;
  BlasTime& operator=(const BlasTime&) = delete;
  double seconds() const;
};

// The OpenBLAS kernel family in use ("SkylakeX", "Haswell", ...). On first use the engine
// replaces a generic fallback (OpenBLAS older than the CPU) with the best family the CPU runs.
const char* blas_kernels();

}  // namespace adjoint
