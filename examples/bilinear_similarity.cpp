// Tensor similarity of two bilinear layers from their weights alone (docs/methods.md §3).
//
// A bilinear layer computes out_o = Σ_h D[o,h] (l_h·x̃)(r_h·x̃), x̃ = (1, x): a quadratic
// polynomial of its input, i.e. one symmetric matrix per output. Two layers are compared
// as the cosine of those tensors, in closed form from H×H products of the factors, with
// no data. What the cosine ignores is exactly what does not change the function: the
// order of the hidden units, and which factor is called left or right.
//
// Usage: bilinear_similarity [A.ckpt B.ckpt]
//   with two checkpoints of one-layer bilinear MLPs (adjoint train --model bilinear_mlp),
//   compares them; without, compares a random layer with transformed copies of itself.
#include <cstdio>
#include <string>

#include "analysis/similarity/tensor_similarity.h"
#include "engine/error.h"
#include "engine/random.h"
#include "models/checkpoint.h"

using namespace adjoint;

// A random layer: `inputs` inputs (plus the bias column 0), `hidden` units, `outputs` outputs.
BilinearForm random_layer(int64_t inputs, int64_t hidden, int64_t outputs, Generator& gen) {
  BilinearForm f;
  f.left = to_matrix64(normal({hidden, inputs + 1}, 0.0f, 1.0f, gen));
  f.right = to_matrix64(normal({hidden, inputs + 1}, 0.0f, 1.0f, gen));
  f.down = to_matrix64(normal({outputs, hidden}, 0.0f, 1.0f, gen));
  return f;
}

// The same layer with its hidden units in reverse order: the same function.
BilinearForm reversed_units(const BilinearForm& f) {
  BilinearForm g = f;
  const int64_t H = f.hidden();
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t c = 0; c < f.left.cols; ++c) {
      g.left(h, c) = f.left(H - 1 - h, c);
      g.right(h, c) = f.right(H - 1 - h, c);
    }
    for (int64_t o = 0; o < f.outputs(); ++o) g.down(o, h) = f.down(o, H - 1 - h);
  }
  return g;
}

// The layer's weights plus noise of relative size `scale`.
BilinearForm perturbed(const BilinearForm& f, double scale, Generator& gen) {
  BilinearForm g = f;
  for (Matrix64* m : {&g.left, &g.right, &g.down}) {
    const Matrix64 noise = to_matrix64(normal({m->rows, m->cols}, 0.0f, 1.0f, gen));
    for (size_t i = 0; i < m->data.size(); ++i) m->data[i] += scale * noise.data[i];
  }
  return g;
}

// One line per metric: the total cosine and the per-output cosines.
void compare(const std::string& what, const BilinearForm& a, const BilinearForm& b) {
  for (const SimilarityMetric& metric : similarity_metrics()) {
    if (metric.needs_data) continue;  // the data metric wants the data's mean and covariance
    const Similarity s = tensor_similarity(metric, a, b, /*bias=*/true);
    std::printf("%-34s %-9s %.4f  per output:", what.c_str(), metric.name, s.total);
    for (double v : s.slices) std::printf(" %.3f", v);
    std::printf("\n");
  }
}

int main(int argc, char** argv) try {
  if (argc == 3) {
    // Two checkpoints: each model describes itself as a polynomial (models/polynomial.h),
    // and bilinear_form folds any linear maps around its one bilinear layer into L, R, D.
    const BilinearForm a = bilinear_form(model_from_checkpoint(load_checkpoint(argv[1]))->polynomial_view());
    const BilinearForm b = bilinear_form(model_from_checkpoint(load_checkpoint(argv[2]))->polynomial_view());
    std::printf("%s: %lld inputs, %lld hidden, %lld outputs\n", argv[1], (long long)a.inputs(),
                (long long)a.hidden(), (long long)a.outputs());
    compare("A against B", a, b);
    return 0;
  }
  check(argc == 1, "give two checkpoints, or none");

  Generator gen(11);
  const BilinearForm a = random_layer(/*inputs=*/10, /*hidden=*/16, /*outputs=*/3, gen);
  BilinearForm swapped = a;
  std::swap(swapped.left, swapped.right);
  compare("A against itself", a, a);
  compare("A, hidden units reversed", a, reversed_units(a));
  compare("A, left and right swapped", a, swapped);
  compare("A, weights + 10% noise", a, perturbed(a, 0.1, gen));
  compare("A against an unrelated layer", a, random_layer(10, 16, 3, gen));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bilinear_similarity: %s\n", e.what());
  return 1;
}
