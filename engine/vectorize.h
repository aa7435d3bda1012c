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
// Use it inside a parallel_for body, around loops that are compute-bound in cache (GELU's
// erf and exp); memory-bound loops gain nothing from it. Measure before adding a call: the
// Winograd transforms, compiled this way, ran no faster.
#pragma once
#include <atomic>

namespace adjoint {

#if defined(__x86_64__) && !defined(__AVX2__)

// Whether run_widest uses AVX2: the CPU has it, unless switched off (the tests compare the
// two paths bit for bit).
inline std::atomic<bool>& avx2_switch() {
  static std::atomic<bool> on{__builtin_cpu_supports("avx2") != 0};
  return on;
}
inline bool avx2_enabled() { return avx2_switch().load(std::memory_order_relaxed); }
// Turns AVX2 off (false) or back on where the CPU has it (true).
inline void enable_avx2(bool on) { avx2_switch() = on && __builtin_cpu_supports("avx2"); }

// `body`, with every call it makes that can be inlined, compiled for AVX2.
template <class Body>
[[gnu::target("avx2"), gnu::flatten]] void run_avx2(Body& body) {
  body();
}

template <class Body>
[[gnu::always_inline]] inline void run_widest(Body&& body) {
  if (avx2_enabled()) return run_avx2(body);
  body();
}

#else  // AVX2 is the baseline already (-Dnative=true on such a CPU), or another architecture

inline bool avx2_enabled() { return false; }
inline void enable_avx2(bool) {}

template <class Body>
[[gnu::always_inline]] inline void run_widest(Body&& body) {
  body();
}

#endif

}  // namespace adjoint
