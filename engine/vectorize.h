// Wider vectors for the elementwise kernels, chosen at run time.
//
// The build targets plain x86-64 so that its binaries run on any x86-64 CPU; there the
// compiler vectorises loops with SSE2, 4 floats a vector. Most CPUs since 2013 have AVX2,
// 8 floats a vector. `run_widest(body)` runs `body` compiled a second time for AVX2 when
// the CPU has it: the body is inlined into a function built with the AVX2 target, together
// with everything it calls that can be inlined. This is what PyTorch's per-CPU kernel
// dispatch does, reduced to one function.
//
// The results are the same bits either way. Each element goes through the same IEEE
// operations; the compiler neither reassociates float sums nor contracts a·b + c into
// an FMA in ISO C++ mode (-std=c++20), and a loop's vector width does not change its order
// of operations, only how many elements it handles at once.
//
// Use it inside a parallel_for body, around loops that are compute-bound in cache (the
// Winograd transforms, GELU's erf and exp); memory-bound loops gain nothing from it.
#pragma once

namespace adjoint {

#if defined(__x86_64__) && !defined(__AVX2__)

// Whether the CPU runs AVX2 code; asked once.
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// `body`, with every call it makes that can be inlined, compiled for AVX2.
template <class Body>
[[gnu::target("avx2"), gnu::flatten]] void run_avx2(Body& body) {
  body();
}

template <class Body>
[[gnu::always_inline]] inline void run_widest(Body&& body) {
  if (cpu_has_avx2()) return run_avx2(body);
  body();
}

#else  // AVX2 is the baseline already (-Dnative=true on such a CPU), or another architecture

template <class Body>
[[gnu::always_inline]] inline void run_widest(Body&& body) {
  body();
}

#endif

}  // namespace adjoint
