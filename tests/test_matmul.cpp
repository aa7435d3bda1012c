// matmul and linear: gradients, PyTorch goldens (tests/goldens/gen_conv.py), the engine
// GEMM's panel split, bad shapes.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/threads.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reference/reference.h"
#include "tests/golden_case.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

Tensor matmul_of(const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }
Tensor linear_of(const std::vector<Tensor>& in) { return linear(in[0], in[1], in.size() > 2 ? in[2] : Tensor()); }

// (M, K) · (K, N) in double, the reference for the engine's GEMM.
std::vector<double> naive_product(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  std::vector<float> av = a.to_vector(), bv = b.to_vector();
  std::vector<double> c(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) c[i * N + j] += double(av[i * K + k]) * double(bv[k * N + j]);
  return c;
}

// Restores the thread count a test changed.
struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

}  // namespace

TEST_CASE("matmul: gradients (plain, batched, folded)") {
  check_gradients(matmul_of, {random_tensor({4, 3}, 1), random_tensor({3, 5}, 2)});
  check_gradients(matmul_of, {random_tensor({2, 3, 4, 3}, 3), random_tensor({2, 3, 3, 2}, 4)});
  check_gradients(matmul_of, {random_tensor({2, 3, 4}, 5), random_tensor({4, 2}, 6)});
}

TEST_CASE("matmul: matches PyTorch") {
  check_golden_case("conv", "matmul.plain", 2, matmul_of);
  check_golden_case("conv", "matmul.batched", 2, matmul_of);
  check_golden_case("conv", "matmul.folded", 2, matmul_of);
}

TEST_CASE("matmul: every transport carries the exact vector-Jacobian product") {
  const std::vector<Tensor> in = {random_tensor({3, 4}, 7), random_tensor({4, 2}, 8)};
  const Tensor u = random_tensor({3, 2}, 9);
  const auto g = vjp(matmul_of, in, u, Transport::gradient());
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
    const auto p = vjp(matmul_of, in, u, t);
    CHECK(p[0].to_vector() == g[0].to_vector());
    CHECK(p[1].to_vector() == g[1].to_vector());
  }
}

TEST_CASE("matmul: large products split into panels, match a double product and keep their bits at any thread count") {
  ThreadCount restore;
  // 300 × 700 × 600: above the split threshold, with uneven panels.
  const Tensor a = random_tensor({300, 700}, 10), b = random_tensor({700, 600}, 11);
  set_num_threads(1);
  const std::vector<float> one = matmul(a, b).to_vector();
  set_num_threads(2);
  const std::vector<float> two = matmul(a, b).to_vector();
  CHECK(one == two);
  set_num_threads(3);  // panels in a multiple of the thread count: three here, of uneven widths
  CHECK(matmul(a, b).to_vector() == one);
  const std::vector<double> ref = naive_product(a, b);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(ref[i] - one[i]));
  CHECK(worst < 1e-3);
  CHECK(std::string(blas_kernels()).size() > 0);
}

TEST_CASE("matmul: an empty inner dimension gives zeros") {
  const Tensor c = matmul(Tensor::empty({3, 0}), Tensor::empty({0, 2}));
  CHECK(c.shape() == Shape{3, 2});
  CHECK(c.to_vector() == std::vector<float>(6, 0.0f));
}

TEST_CASE("matmul: bad shapes") {
  CHECK_THROWS_WITH_AS(matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})),
                       doctest::Contains("matmul: a [2, 3] and b [4, 5] have inner dimensions 3 and 4"), Error);
  CHECK_THROWS_WITH_AS(matmul(Tensor::zeros({3}), Tensor::zeros({3, 4})),
                       doctest::Contains("matmul: expects matrices (2-D or more), got a [3]"), Error);
  CHECK_THROWS_WITH_AS(matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})),
                       doctest::Contains("matmul: batch dimensions differ: a [2, 3, 4] and b [3, 4, 5]"), Error);
}

TEST_CASE("linear: gradients with and without bias") {
  check_gradients(linear_of, {random_tensor({2, 3, 4}, 12), random_tensor({5, 4}, 13), random_tensor({5}, 14)});
  check_gradients(linear_of, {random_tensor({4}, 15), random_tensor({3, 4}, 16)});
}

TEST_CASE("linear: a residual is summed by the product, with every transport as linear + add") {
  // Finite differences through all four inputs, with and without the bias.
  auto with_residual = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2], in[3]); };
  check_gradients(with_residual, {random_tensor({2, 3, 4}, 21), random_tensor({5, 4}, 22), random_tensor({5}, 23),
                                  random_tensor({2, 3, 5}, 24)});
  check_gradients([](const std::vector<Tensor>& in) { return linear(in[0], in[1], Tensor(), in[2]); },
                  {random_tensor({3, 4}, 25), random_tensor({2, 4}, 26), random_tensor({3, 2}, 27)});
  // Against its definition, linear then add, under every transport.
  const std::vector<Tensor> in = {random_tensor({6, 4}, 28), random_tensor({3, 4}, 29), random_tensor({3}, 30),
                                  random_tensor({6, 3}, 31)};
  auto in_turn = [](const std::vector<Tensor>& v) { return v[3] + linear(v[0], v[1], v[2]); };
  const Tensor u = random_tensor({6, 3}, 32);
  check_close(with_residual(in), in_turn(in), 1e-6, 1e-6, "forward");
  for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback()}) {
    const std::vector<Tensor> got = vjp(with_residual, in, u, t), want = vjp(in_turn, in, u, t);
    for (size_t i = 0; i < in.size(); ++i) check_close(got[i], want[i], 1e-6, 1e-6, cat("input ", i));
    CHECK(got[3].to_vector() == u.to_vector());  // the residual's cotangent is u itself
  }
  CHECK_THROWS_WITH_AS(linear(Tensor::zeros({8, 20}), Tensor::zeros({10, 20}), Tensor(), Tensor::zeros({8, 20})),
                       doctest::Contains("linear: residual [8, 20] does not match the output [8, 10]"), Error);
}

TEST_CASE("linear: matches PyTorch") {
  check_golden_case("conv", "linear.bias", 3, linear_of);
  check_golden_case("conv", "linear.nobias", 2, linear_of);
}

TEST_CASE("linear: a layer as wide as ViT-B's, with bias and residual, against the reference") {
  // 260 rows (edge tiles), 768 in, 776 out: shapes that linear's route table names, on
  // whichever kernel it chooses. Forward, the three gradients, directional finite
  // differences, and the same bits at 1 and 2 threads.
  const int64_t rows = 260, in = 768, out = 776;
  const Tensor x = random_tensor({2, rows / 2, in}, 41), w = random_tensor({out, in}, 42, -0.05f, 0.05f),
               b = random_tensor({out}, 43), r = random_tensor({2, rows / 2, out}, 44), u = random_tensor({2, rows / 2, out}, 45);
  auto f = [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2], v[3]); };
  const ThreadCount restore;
  std::vector<std::vector<float>> forward_bits, gradient_bits;
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    const std::vector<Tensor> in_leaves = leaves({x, w, b, r});
    const Tensor y = f(in_leaves);
    forward_bits.push_back(y.to_vector());
    const std::vector<Tensor> g = grad(y, in_leaves, u);
    std::vector<float> all;
    for (const Tensor& t : g) {
      const std::vector<float> v = t.to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    gradient_bits.push_back(all);
    if (threads != 1) continue;
    using namespace reference;
    Values want = linear_forward(values(x), values(w), values(b), rows, in, out);
    const Values residual = values(r);
    for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
    check_close(y, to_tensor(y.shape(), want), 1e-5, 1e-5, "forward");
    const LinearGrads ref = linear_backward(values(u), values(x), values(w), rows, in, out);
    check_close(g[0], to_tensor(x.shape(), ref.dx), 1e-5, 1e-5, "dx");
    check_close(g[1], to_tensor(w.shape(), ref.dw), 1e-5, 1e-4, "dw");
    check_close(g[2], to_tensor(b.shape(), ref.dbias), 1e-5, 1e-4, "dbias");
    CHECK(max_abs(g[0]) > 0.1);
    CHECK(max_abs(g[1]) > 0.1);
    // Directional finite differences: <u, f(x + eps·dx_dir, w + eps·dw_dir) − f(… − …)> / 2 eps
    // against <dx, dx_dir> + <dw, dw_dir>. f is affine in each, so only rounding separates them.
    const Tensor dx_dir = random_tensor(x.shape(), 46), dw_dir = random_tensor(w.shape(), 47);
    const float eps = 0.01f;
    const Tensor plus = f({x + dx_dir * eps, w + dw_dir * eps, b, r}), minus = f({x - dx_dir * eps, w - dw_dir * eps, b, r});
    const std::vector<float> p = plus.to_vector(), m = minus.to_vector(), uv = u.to_vector();
    double numeric = 0;
    for (size_t i = 0; i < p.size(); ++i) numeric += double(uv[i]) * (double(p[i]) - double(m[i])) / (2.0 * eps);
    double analytic = 0;
    const std::vector<float> gx = g[0].to_vector(), gw = g[1].to_vector(), vx = dx_dir.to_vector(), vw = dw_dir.to_vector();
    for (size_t i = 0; i < gx.size(); ++i) analytic += double(gx[i]) * double(vx[i]);
    for (size_t i = 0; i < gw.size(); ++i) analytic += double(gw[i]) * double(vw[i]);
    CHECK(std::abs(analytic) > 1.0);
    CHECK(std::abs(numeric - analytic) < 1e-3 * std::abs(analytic));
  }
  CHECK(forward_bits[0] == forward_bits[1]);
  CHECK(gradient_bits[0] == gradient_bits[1]);
}

TEST_CASE("linear: the bias gradient sums many rows in double") {
  // 20000 rows of 0.1: a float running sum would drift visibly; the double one does not.
  const Tensor x = Tensor::zeros({20000, 3}).requires_grad_(), w = Tensor::zeros({2, 3}),
               b = Tensor::zeros({2}).requires_grad_();
  const Tensor y = linear(x, w, b);
  const auto g = grad(y, {b}, Tensor::full(y.shape(), 0.1f));
  CHECK(std::abs(g[0].at({0}) - 2000.0f) < 1e-3);
  CHECK(std::abs(g[0].at({1}) - 2000.0f) < 1e-3);
}

TEST_CASE("linear: bad shapes") {
  CHECK_THROWS_WITH_AS(linear(Tensor::zeros({8, 30}), Tensor::zeros({10, 20})),
                       doctest::Contains("linear: weight [10, 20] expects 20 input features, input is [8, 30]"), Error);
  CHECK_THROWS_WITH_AS(linear(Tensor::zeros({8, 20}), Tensor::zeros({10, 20}), Tensor::zeros({5})),
                       doctest::Contains("linear: bias [5] does not match weight [10, 20]"), Error);
  CHECK_THROWS_WITH_AS(linear(Tensor::zeros({8, 20}), Tensor::zeros({20})),
                       doctest::Contains("linear: weight must be 2-D (out, in), got [20]"), Error);
}

TEST_CASE("gemm: under an address-space limit a product fails with 'out of memory' instead of spinning") {
  // In a child process limited to its current address space plus 48 MiB, a new thread's
  // first product cannot map OpenBLAS's 128 MiB buffer. OpenBLAS alone would retry that
  // mapping forever; the alarm turns such a hang into a failure.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(30);
    long pages = 0;
    std::FILE* statm = std::fopen("/proc/self/statm", "r");
    if (statm == nullptr || std::fscanf(statm, "%ld", &pages) != 1) ::_exit(3);
    std::fclose(statm);
    const rlim_t limit = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t(48) << 20);
    const rlimit as{limit, limit};
    if (::setrlimit(RLIMIT_AS, &as) != 0) ::_exit(4);
    int code = 1;
    std::thread worker([&] {
      std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
      try {
        gemm_serial(false, false, 64, 64, 64, 1.0f, a.data(), 64, a.data(), 64, 0.0f, c.data(), 64);
        code = 1;  // the product ran: the check did not fire
      } catch (const Error& e) {
        code = std::string(e.what()).find("out of memory: cannot map the 129 MiB work buffer") == 0 ? 0 : 2;
      }
    });
    worker.join();
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  INFO("child status ", status, " (exit 0: refused with the message; 1: ran; 2: other message; signal: hung)");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("gemm: BlasTime meters the CPU time inside OpenBLAS's products, and only theirs") {
  const int64_t n = 256;
  std::vector<float> a(size_t(n * n), 0.5f), c(size_t(n * n));
  auto product = [&](GemmKernel kernel) {
    gemm(false, true, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n, kernel);
  };
  auto process_cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  {
    BlasTime meter;
    CHECK(meter.seconds() == 0.0);
    CHECK_THROWS_AS(BlasTime(), Error);  // one meter at a time
    const double start = process_cpu_seconds();
    for (int r = 0; r < 5; ++r) product(GemmKernel::blas);
    const double spent = process_cpu_seconds() - start;
    CHECK(meter.seconds() > 0.0);
    CHECK(meter.seconds() <= spent * 1.01 + 1e-4);  // a part of the process's CPU time, not more
    CHECK(c[0] == doctest::Approx(0.25 * double(n)));
  }
  if (avx512_gemm_available()) {  // the engine's own kernels are not OpenBLAS's
    BlasTime meter;
    product(GemmKernel::widest);
    CHECK(meter.seconds() == 0.0);
  }
}
