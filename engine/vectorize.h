// Wider vectors for the elementwise kernels, chosen at run time.
//
// The build targets plain x86-64 so that its binaries run on any x86-64 CPU; there the
// compiler vectorises loops with SSE2, 4 floats a vector. Most CPUs since 2013 have AVX2,
// 8 floats a vector, and many since 2017 AVX-512, 16. `run_widest(body)` runs `body`
// compiled a second (and third) time for the widest of these the CPU has: the body is
// inlined into a function built with that target, together with everything it calls that
// can be inlined. This is what PyTorch's per-CPU kernel dispatch does, reduced to one
// function.
//
// The results are the same bits either way. Each element goes through the same IEEE
// operations; the compiler neither reassociates float sums (no -ffast-math) nor contracts
// a·b + c into an FMA (-ffp-contract=off, meson.build: AVX-512 implies FMA), and a loop's
// vector width does not change its order of operations, only how many elements it
// handles at once. A body may ask for a fused multiply-add itself (std::fma, rounded once
// on every path): the AVX2 and AVX-512 bodies are built with FMA, so it is one
// instruction there, and a libm call on plain x86-64.
//
// Use it inside a parallel_for body, around loops that are compute-bound in cache (GELU's
// erf and exp, the soft gates); memory-bound loops gain nothing from it. Measure before
// adding a call (`adjoint bench`): a loop that waits on memory, such as the Winograd
// transforms, gains nothing.
#pragma once
#include <algorithm>
#include <atomic>

namespace adjoint {

// The instruction sets run_widest chooses from, narrowest first.
enum class VectorIsa { Baseline = 0, Avx2 = 1, Avx512 = 2 };

#if defined(__x86_64__) && !defined(__AVX2__)

// The widest the CPU runs (AVX-512 here means F, VL, BW and DQ).
inline VectorIsa cpu_vector_isa() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq"))
    return VectorIsa::Avx512;
  // The AVX2 path also uses FMA, which every AVX2 CPU of Intel and AMD has.
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? VectorIsa::Avx2 : VectorIsa::Baseline;
}
inline std::atomic<VectorIsa>& vector_isa_switch() {
  static std::atomic<VectorIsa> isa{cpu_vector_isa()};
  return isa;
}
// What run_widest uses now: the CPU's widest unless capped (the tests compare every path
// bit for bit).
inline VectorIsa vector_isa() { return vector_isa_switch().load(std::memory_order_relaxed); }
// Caps run_widest at `widest` (never beyond what the CPU runs); the CPU's widest to restore.
inline void cap_vector_isa(VectorIsa widest) { vector_isa_switch() = std::min(widest, cpu_vector_isa()); }

// `body`, with every call it makes that can be inlined, compiled for AVX2 or AVX-512.
template <class Body>
[[gnu::target("avx2,fma"), gnu::flatten]] void run_avx2(Body& body) {
  body();
}
template <class Body>
[[gnu::target("avx2,avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512"), gnu::flatten]] void run_avx512(
    Body& body) {
  body();
}

template <class Body>
[[gnu::always_inline]] inline void run_widest(Body&& body) {
  switch (vector_isa()) {
    case VectorIsa::Avx512: return run_avx512(body);
    case VectorIsa::Avx2: return run_avx2(body);
    case VectorIsa::Baseline: break;
  }
  body();
}

#else  // the baseline has AVX2 already (-Dnative=true on such a CPU), or another architecture

inline VectorIsa cpu_vector_isa() { return VectorIsa::Baseline; }
inline VectorIsa vector_isa() { return VectorIsa::Baseline; }
inline void cap_vector_isa(VectorIsa) {}

template <class Body>
[[gnu::always_inline]] inline void run_widest(Body&& body) {
  body();
}

#endif

}  // namespace adjoint
