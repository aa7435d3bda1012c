#include "engine/io/crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace adjoint {

namespace {

#if defined(__x86_64__)
// Folding, as in Intel's white paper "Fast CRC Computation for Generic Polynomials Using
// PCLMULQDQ" (Gopal et al., 2009), for the bit-reflected CRC-32 polynomial P = 0x104C11DB7.
// Four 128-bit lanes run over 64-byte steps: each lane's running remainder R is carried
// 512 bits forward as R.lo · (x^(512+32) mod P) ⊕ R.hi · (x^(512−32) mod P) and the next
// 16 bytes are added; then the lanes are folded into one (128-bit distances), the 128 bits
// reduced to 64 and then to 32 (Barrett reduction with μ = floor(x^64 / P)). The
// constants are those powers of x, bit-reflected and shifted by one as the paper gives them.
constexpr uint64_t kFold512Lo = 0x154442bd4, kFold512Hi = 0x1c6e41596;  // x^(4·128+32), x^(4·128−32) mod P
constexpr uint64_t kFold128Lo = 0x1751997d0, kFold128Hi = 0x0ccaa009e;  // x^(128+32), x^(128−32) mod P
constexpr uint64_t kFold64 = 0x163cd6124;                               // x^64 mod P
constexpr uint64_t kPoly = 0x1db710641, kMu = 0x1f7011641;              // P and μ, reflected

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i r, __m128i k, __m128i next) {
  const __m128i lo = _mm_clmulepi64_si128(r, k, 0x00), hi = _mm_clmulepi64_si128(r, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

// The CRC register (no pre- or post-inversion) after `size` bytes, size ≥ 64 and a multiple of 16.
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_folded(uint32_t crc, const unsigned char* p, size_t size) {
  const auto load = [](const unsigned char* at) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(at)); };
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(int(crc)));
  __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
  p += 64, size -= 64;
  const __m128i k512 = _mm_set_epi64x(int64_t(kFold512Hi), int64_t(kFold512Lo));
  for (; size >= 64; p += 64, size -= 64) {
    x1 = fold(x1, k512, load(p));
    x2 = fold(x2, k512, load(p + 16));
    x3 = fold(x3, k512, load(p + 32));
    x4 = fold(x4, k512, load(p + 48));
  }
  const __m128i k128 = _mm_set_epi64x(int64_t(kFold128Hi), int64_t(kFold128Lo));
  x1 = fold(x1, k128, x2);
  x1 = fold(x1, k128, x3);
  x1 = fold(x1, k128, x4);
  for (; size >= 16; p += 16, size -= 16) x1 = fold(x1, k128, load(p));
  // 128 → 64 bits (with the 32 zero bits the CRC's definition appends), then 64 → 32.
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k128, 0x10), _mm_srli_si128(x1, 8));
  const __m128i k64 = _mm_set_epi64x(0, int64_t(kFold64));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k64, 0x00), _mm_srli_si128(x1, 4));
  const __m128i barrett = _mm_set_epi64x(int64_t(kMu), int64_t(kPoly));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), barrett, 0x00);
  return uint32_t(_mm_extract_epi32(_mm_xor_si128(x1, t), 1));
}

bool has_pclmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, const unsigned char* bytes, size_t size) {
#if defined(__x86_64__)
  if (size >= 64 && has_pclmul()) {
    const size_t folded = size & ~size_t(15);
    crc = ~crc32_folded(~crc, bytes, folded);
    bytes += folded, size -= folded;
  }
#endif
  return uint32_t(crc32_z(crc, bytes, size));
}

}  // namespace adjoint
