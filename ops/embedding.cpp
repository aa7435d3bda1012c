// Embedding: a gather of weight rows forward, a scatter-add of cotangent rows backward.
#include "ops/embedding.h"

#include <algorithm>
#include <memory>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

constexpr int64_t kGrain = 16384;

// g[v] = Σ u[p] over the positions p with indices[p] = v, p ascending.
//
// Positions are grouped by row first (a stable counting sort), so that each row's sum is
// one task: no two tasks write the same row, and the order of every sum is fixed.
class EmbeddingNode : public Node {
public:
  EmbeddingNode(Shape weight_shape, std::vector<int64_t> indices)
      : weight_shape_(std::move(weight_shape)), indices_(std::move(indices)) {}
  std::string name() const override { return "embedding"; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override {
    const int64_t rows = weight_shape_[0], dim = weight_shape_[1];
    std::vector<int64_t> start(static_cast<size_t>(rows + 1), 0);
    for (int64_t v : indices_) ++start[v + 1];
    for (int64_t v = 0; v < rows; ++v) start[v + 1] += start[v];
    std::vector<int64_t> positions(indices_.size()), fill(start.begin(), start.end() - 1);
    for (size_t p = 0; p < indices_.size(); ++p) positions[fill[indices_[p]]++] = int64_t(p);

    const Tensor u = cotangent.contiguous();
    Tensor g = Tensor::zeros(weight_shape_);
    const float* pu = u.data();
    float* pg = g.data();
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1)), [&](int64_t b, int64_t e) {
      for (int64_t v = b; v < e; ++v) {
        float* row = pg + v * dim;
        for (int64_t k = start[v]; k < start[v + 1]; ++k) {
          const float* from = pu + positions[k] * dim;
          for (int64_t d = 0; d < dim; ++d) row[d] += from[d];
        }
      }
    });
    return {g};
  }

private:
  Shape weight_shape_;
  std::vector<int64_t> indices_;
};

}  // namespace

Tensor embedding(const Tensor& weight_in, const std::vector<int64_t>& indices, Shape index_shape) {
  check(weight_in.dim() == 2, "embedding: weight must be (V, D), got ", weight_in.shape());
  check(int64_t(indices.size()) == numel(index_shape), "embedding: ", indices.size(), " indices for index shape ",
        index_shape);
  const int64_t rows = weight_in.size(0), dim = weight_in.size(1);
  for (size_t p = 0; p < indices.size(); ++p)
    check(indices[p] >= 0 && indices[p] < rows, "embedding: index ", indices[p], " at position ", p,
          " is out of range for weight ", weight_in.shape());

  const Tensor weight = weight_in.contiguous();
  Shape shape = index_shape;
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape);
  const float* pw = weight.data();
  float* po = out.data();
  parallel_for(int64_t(indices.size()), std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t p = b; p < e; ++p)
                   std::copy(pw + indices[p] * dim, pw + (indices[p] + 1) * dim, po + p * dim);
               });
  if (needs_grad({weight})) attach(out, std::make_shared<EmbeddingNode>(weight.shape(), indices), {weight});
  return out;
}

}  // namespace adjoint
