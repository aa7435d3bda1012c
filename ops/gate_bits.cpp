#include "ops/gate_bits.h"

#include "engine/vectorize.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint {

namespace {

void write_gate_bits_plain(const float* y, int64_t L, uint16_t* bits) {
  for (int64_t w = 0; w < gate_words(L); ++w) {
    unsigned word = 0;
    for (int64_t j = 0; j < 16 && 16 * w + j < L; ++j) word |= unsigned(y[16 * w + j] > 0.0f) << j;
    bits[w] = static_cast<uint16_t>(word);
  }
}

void select_by_gate_bits_plain(const uint16_t* bits, const float* u, int64_t L, float* out) {
  for (int64_t l = 0; l < L; ++l) out[l] = (bits[l / 16] >> (l % 16)) & 1u ? u[l] : 0.0f;
}

#if defined(__x86_64__)
// A word is one vector compare (its mask is the word) and one masked load; only the row's
// last word, when it is partial, masks its loads and stores.
ADJOINT_AVX512 void write_gate_bits_avx512(const float* y, int64_t L, uint16_t* bits) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t l = 0;
  for (; l + 16 <= L; l += 16) bits[l / 16] = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + l), zero, _CMP_GT_OQ);
  if (l == L) return;
  const __mmask16 inside = first_lanes(L - l);
  bits[l / 16] = _mm512_mask_cmp_ps_mask(inside, _mm512_maskz_loadu_ps(inside, y + l), zero, _CMP_GT_OQ);
}

ADJOINT_AVX512 void select_by_gate_bits_avx512(const uint16_t* bits, const float* u, int64_t L, float* out) {
  int64_t l = 0;
  for (; l + 16 <= L; l += 16) _mm512_storeu_ps(out + l, _mm512_maskz_loadu_ps(bits[l / 16], u + l));
  if (l == L) return;
  const __mmask16 inside = first_lanes(L - l);
  _mm512_mask_storeu_ps(out + l, inside, _mm512_maskz_loadu_ps(inside & bits[l / 16], u + l));
}
#endif

}  // namespace

void write_gate_bits(const float* y, int64_t L, uint16_t* bits) {
#if defined(__x86_64__)
  if (vector_isa() == VectorIsa::Avx512) return write_gate_bits_avx512(y, L, bits);
#endif
  write_gate_bits_plain(y, L, bits);
}

void select_by_gate_bits(const uint16_t* bits, const float* u, int64_t L, float* out) {
#if defined(__x86_64__)
  if (vector_isa() == VectorIsa::Avx512) return select_by_gate_bits_avx512(bits, u, L, out);
#endif
  select_by_gate_bits_plain(bits, u, L, out);
}

}  // namespace adjoint
