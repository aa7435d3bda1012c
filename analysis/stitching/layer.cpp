#include "analysis/stitching/layer.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/conv.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

bool is_map(const Shape& s) { return s.size() == 3; }
bool is_tokens(const Shape& s) { return s.size() == 2; }

// Why no affine map joins the two shapes, or "" when one does.
std::string refusal(const Shape& front, const Shape& end) {
  if (is_map(front) && is_map(end)) return "";
  if (is_tokens(front) && is_tokens(end))
    return front[0] == end[0] || (token_grid_side(front[0]) > 0 && token_grid_side(end[0]) > 0)
               ? ""
               : cat("token counts differ (", front[0], " against ", end[0], ") and are not both 1 + g²");
  const auto not_a_grid = [](int64_t tokens, const char* side) {
    return cat("the ", side, "'s ", tokens, " tokens are not a class token and a square grid of patch tokens (1 + g²), ",
               "so the map↔token adapter does not apply");
  };
  if (is_map(front) && is_tokens(end)) return token_grid_side(end[0]) > 0 ? "" : not_a_grid(end[0], "end");
  if (is_tokens(front) && is_map(end)) return token_grid_side(front[0]) > 0 ? "" : not_a_grid(front[0], "front");
  return "a stitch joins feature maps (C, H, W) or token sequences (T, D) only";
}

// Solves S·X = R for X in place of R, S (n × n) symmetric positive definite, R (n × m),
// both row-major, by Cholesky factorisation. Returns false when S is singular to working
// precision: a pivot at most 1e-10 of its diagonal entry (rounding leaves an exactly
// singular matrix with tiny positive pivots, which would give huge, meaningless weights).
bool cholesky_solve(std::vector<double>& S, std::vector<double>& R, int64_t n, int64_t m) {
  for (int64_t j = 0; j < n; ++j) {
    double d = S[j * n + j];
    const double diagonal = d;
    for (int64_t k = 0; k < j; ++k) d -= S[j * n + k] * S[j * n + k];
    if (!(d > 1e-10 * diagonal)) return false;
    const double l = std::sqrt(d);
    S[j * n + j] = l;
    for (int64_t i = j + 1; i < n; ++i) {
      double v = S[i * n + j];
      for (int64_t k = 0; k < j; ++k) v -= S[i * n + k] * S[j * n + k];
      S[i * n + j] = v / l;
    }
  }
  for (int64_t c = 0; c < m; ++c) {
    for (int64_t i = 0; i < n; ++i) {  // L y = r
      double v = R[i * m + c];
      for (int64_t k = 0; k < i; ++k) v -= S[i * n + k] * R[k * m + c];
      R[i * m + c] = v / S[i * n + i];
    }
    for (int64_t i = n - 1; i >= 0; --i) {  // Lᵀ x = y
      double v = R[i * m + c];
      for (int64_t k = i + 1; k < n; ++k) v -= S[k * n + i] * R[k * m + c];
      R[i * m + c] = v / S[i * n + i];
    }
  }
  return true;
}

// Features (N, *shape) as rows of channels in double: (N·H·W, C) for maps, (N·T, D) for tokens.
std::vector<double> rows_of(const Tensor& features, int64_t* rows, int64_t* width) {
  const Tensor t = features.dim() == 4 ? permute(features, {0, 2, 3, 1}).contiguous() : features.contiguous();
  *width = t.size(-1);
  *rows = t.numel() / *width;
  return std::vector<double>(t.data(), t.data() + t.numel());
}

}  // namespace

Tensor resize_matrix(int64_t in, int64_t out) {
  check(in > 0 && out > 0, "resize_matrix: sizes must be positive, got ", in, " → ", out);
  std::vector<float> m(size_t(out * in), 0.0f);
  for (int64_t i = 0; i < out; ++i) {
    if (out == in) {
      m[size_t(i * in + i)] = 1.0f;
    } else if (out < in) {  // area: the window of adaptive average pooling
      const int64_t start = (i * in) / out, end = ((i + 1) * in + out - 1) / out;
      for (int64_t k = start; k < end; ++k) m[size_t(i * in + k)] = 1.0f / float(end - start);
    } else {  // linear interpolation, align_corners = False
      const double source = std::max(0.0, (double(i) + 0.5) * double(in) / double(out) - 0.5);
      const int64_t lo = std::min(int64_t(source), in - 1), hi = std::min(lo + 1, in - 1);
      const double frac = source - double(lo);
      m[size_t(i * in + lo)] += float(1.0 - frac);
      m[size_t(i * in + hi)] += float(frac);
    }
  }
  return Tensor::from_vector({out, in}, std::move(m));
}

Tensor resize_maps(const Tensor& maps, int64_t height, int64_t width) {
  check(maps.dim() == 4, "resize_maps: expects feature maps (N, C, H, W), got ", maps.shape());
  Tensor h = maps;
  if (h.size(3) != width) h = matmul(h, transpose(resize_matrix(h.size(3), width), 0, 1));
  if (h.size(2) != height)
    h = transpose(matmul(transpose(h, 2, 3), transpose(resize_matrix(h.size(2), height), 0, 1)), 2, 3);
  return h;
}

int64_t token_grid_side(int64_t tokens) {
  for (int64_t g = 1; g * g < tokens; ++g)
    if (1 + g * g == tokens) return g;
  return 0;
}

namespace {

// The patch tokens of a ViT sequence (N, 1 + g², D) laid on their grid: (N, D, g, g).
Tensor patch_grid(const Tensor& tokens) {
  const int64_t N = tokens.size(0), T = tokens.size(1), D = tokens.size(2), g = token_grid_side(T);
  check(g > 0, "stitch: the front's ", T, " tokens are not 1 + g²");
  return reshape(transpose(slice(tokens, 1, 1, T), 1, 2), {N, D, g, g});
}

// Maps (N, C, H, W) resized to the grid of a ViT sequence of `tokens` = 1 + g² tokens and
// read row-major as its patch tokens: (N, g², C).
Tensor grid_tokens(const Tensor& maps, int64_t tokens) {
  const int64_t g = token_grid_side(tokens), N = maps.size(0), C = maps.size(1);
  check(g > 0, "stitch: the end's ", tokens, " tokens are not 1 + g²");
  return transpose(reshape(resize_maps(maps, g, g), {N, C, g * g}), 1, 2);
}

}  // namespace

Tensor align_to_end(const Tensor& h, const Shape& end_example_shape) {
  check(h.dim() == 3 || h.dim() == 4, "stitch: expects feature maps (N, C, H, W) or tokens (N, T, D), got ", h.shape());
  check(is_map(end_example_shape) || is_tokens(end_example_shape), "stitch: the end features ", end_example_shape,
        " are neither maps (C, H, W) nor tokens (T, D)");
  if (is_map(end_example_shape))
    return resize_maps(h.dim() == 3 ? patch_grid(h) : h, end_example_shape[1], end_example_shape[2]);
  if (h.dim() == 4) return grid_tokens(h, end_example_shape[0]);
  if (h.size(1) == end_example_shape[0]) return h;
  // Tokens into another grid of tokens: the class token stays, the patch grid is resized.
  return concat({slice(h, 1, 0, 1), grid_tokens(patch_grid(h), end_example_shape[0])}, 1);
}

Tensor apply_stitch(const Tensor& h, const Tensor& weight, const Tensor& bias, const Shape& end_example_shape) {
  const Tensor aligned = align_to_end(h, end_example_shape);
  if (is_map(end_example_shape))
    return conv2d(aligned, reshape(weight, {weight.size(0), weight.size(1), 1, 1}), bias);
  const Tensor tokens = linear(aligned, weight, bias);
  if (h.dim() == 3) return tokens;
  return concat({mean(tokens, {1}, true), tokens}, 1);  // the class token: the mean of the patch tokens
}

Stitch::Stitch(StitchShapes shapes) : shapes_(std::move(shapes)) {
  const std::string why = refusal(shapes_.front, shapes_.end);
  if (!why.empty())
    throw Error(cat("stitch ", shapes_.where, ": cannot join front features ", shapes_.front, " to end features ",
                    shapes_.end, ": ", why));
  const int64_t in = shapes_.front[is_tokens(shapes_.front) ? 1 : 0];
  const int64_t out = shapes_.end[is_tokens(shapes_.end) ? 1 : 0];
  weight = register_parameter("weight", Tensor::zeros({out, in}));
  bias = register_parameter("bias", Tensor::zeros({out}));
}

Tensor Stitch::forward(const Tensor& front_features) const {
  Shape expected = shapes_.front;
  expected.insert(expected.begin(), front_features.defined() ? front_features.size(0) : 0);
  check(front_features.defined() && front_features.shape() == expected, "stitch ", shapes_.where,
        ": expects front features (N, ", shapes_.front, "), got ", front_features.defined() ? front_features.shape() : Shape{});
  return apply_stitch(front_features, weight, bias, shapes_.end);
}

void Stitch::init_identity() {
  check(in_features() == out_features(), "stitch ", shapes_.where, ": identity initialisation needs equal widths, got ",
        shapes_.front, " → ", shapes_.end);
  Tensor w = Tensor::zeros(weight.shape());
  for (int64_t i = 0; i < in_features(); ++i) w.data()[i * in_features() + i] = 1.0f;
  weight.copy_from(w);
  bias.fill_(0.0f);
}

void Stitch::init_random(Generator& gen) {
  const float bound = 1.0f / std::sqrt(float(in_features()));
  weight.copy_from(uniform(weight.shape(), -bound, bound, gen));
  bias.fill_(0.0f);
}

void Stitch::init_least_squares(const Tensor& front, const Tensor& end, double ridge) {
  check(front.defined() && end.defined() && front.dim() >= 1 && end.dim() >= 1 && front.size(0) == end.size(0) &&
            front.size(0) > 0,
        "stitch ", shapes_.where, ": least squares needs paired batches, got ", front.shape(), " and ", end.shape());
  Tensor aligned, targets = end;
  {
    NoGrad off;
    aligned = align_to_end(front, shapes_.end);
    // Into tokens from maps the class token is not fitted: it is the mean of the patch tokens.
    if (maps() && is_tokens(shapes_.end) && end.dim() == 3) targets = slice(end, 1, 1, end.size(1));
  }
  int64_t rows = 0, in = 0, end_rows = 0, out = 0;
  std::vector<double> X = rows_of(aligned, &rows, &in);
  std::vector<double> Y = rows_of(targets, &end_rows, &out);
  check(rows == end_rows && in == in_features() && out == out_features(), "stitch ", shapes_.where,
        ": least squares got front features ", front.shape(), " and end features ", end.shape());
  // Centre both sides: the bias is then ȳ − W x̄ and the ridge never touches it.
  std::vector<double> mean_x(size_t(in), 0.0), mean_y(size_t(out), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) mean_x[size_t(c)] += X[size_t(r * in + c)] / double(rows);
    for (int64_t c = 0; c < out; ++c) mean_y[size_t(c)] += Y[size_t(r * out + c)] / double(rows);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) X[size_t(r * in + c)] -= mean_x[size_t(c)];
    for (int64_t c = 0; c < out; ++c) Y[size_t(r * out + c)] -= mean_y[size_t(c)];
  }
  std::vector<double> gram(static_cast<size_t>(in * in)), cross(static_cast<size_t>(in * out));  // XᵀX, XᵀY
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(in), int(in), int(rows), 1.0, X.data(), int(in), X.data(),
              int(in), 0.0, gram.data(), int(in));
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(in), int(out), int(rows), 1.0, X.data(), int(in), Y.data(),
              int(out), 0.0, cross.data(), int(out));
  double trace = 0;
  for (int64_t c = 0; c < in; ++c) trace += gram[size_t(c * in + c)];
  for (int64_t c = 0; c < in; ++c) gram[size_t(c * in + c)] += ridge * trace / double(in);
  check(cholesky_solve(gram, cross, in, out), "stitch ", shapes_.where, ": the least-squares normal equations are ",
        "singular (", rows, " rows of ", in, " front channels, ridge ", ridge, "); use a ridge > 0 or more examples");
  Tensor w = Tensor::empty(weight.shape()), b = Tensor::empty(bias.shape());
  for (int64_t o = 0; o < out; ++o) {
    double shift = mean_y[size_t(o)];
    for (int64_t c = 0; c < in; ++c) {
      const double v = cross[size_t(c * out + o)];
      w.data()[o * in + c] = float(v);
      shift -= v * mean_x[size_t(c)];
    }
    b.data()[o] = float(shift);
  }
  weight.copy_from(w);
  bias.copy_from(b);
}

}  // namespace adjoint
