#include "analysis/stitching/pair.h"

#include <algorithm>

#include "analysis/common/robustness.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/layout.h"

namespace adjoint {

namespace {

std::string describe(const Endpoint& e) { return cat(e.name, " (", e.model->config().arch, ")"); }

void check_endpoint(const Endpoint& e, size_t block, const char* role) {
  check(e.model != nullptr, "stitch: the ", role, " model ", e.name, " is missing");
  check(!e.model->training(), "stitch: the ", role, " model ", describe(e),
        " is in training mode; stitching uses frozen models in eval mode");
  const size_t blocks = e.model->num_blocks();
  check(blocks >= 2 && block + 2 <= blocks, "stitch: ", role, " block ", block, " is out of range for ", describe(e),
        ", which has ", blocks, " blocks (stitch points 0..", blocks >= 2 ? blocks - 2 : 0, ", before the head '",
        e.model->blocks().back().name, "')");
}

Shape example_shape(const Tensor& batch) { return Shape(batch.shape().begin() + 1, batch.shape().end()); }

}  // namespace

Tensor Endpoint::input(const Tensor& raw) const { return normalise_pixels(raw, mean, std, "stitch: " + name); }

StitchPair::StitchPair(Endpoint front, size_t front_block, Endpoint end, size_t end_block, const Shape& input_example)
    : front_(std::move(front)), end_(std::move(end)), front_block_(front_block), end_block_(end_block) {
  check_endpoint(front_, front_block_, "front");
  check_endpoint(end_, end_block_, "end");
  shapes_.where = cat("front ", describe(front_), " block ", front_block_, " '", front_.model->blocks()[front_block_].name,
                      "' → end ", describe(end_), " block ", end_block_, " '", end_.model->blocks()[end_block_].name, "'");
  Shape probe = input_example;
  probe.insert(probe.begin(), 1);
  NoGrad off;
  const Tensor x = Tensor::zeros(probe);
  shapes_.front = example_shape(front_features(x));
  shapes_.end = example_shape(end_.model->features(end_.input(x), end_block_));
}

Tensor StitchPair::front_features(const Tensor& raw) const {
  return front_.model->features(front_.input(raw), front_block_);
}

std::vector<Tensor> StitchPair::end_targets(const Tensor& raw) const {
  NoGrad off;
  const Model& b = *end_.model;
  const Tensor h = b.features(end_.input(raw), end_block_);
  std::vector<Tensor> path = b.trace(h, end_block_ + 1, b.num_blocks());
  path.insert(path.begin(), h);
  return path;
}

std::vector<Tensor> StitchPair::stitched_path(const Stitch& stitch, const Tensor& front_features) const {
  const Model& b = *end_.model;
  const Tensor s = stitch.forward(front_features);
  std::vector<Tensor> path = b.trace(s, end_block_ + 1, b.num_blocks());
  path.insert(path.begin(), s);
  return path;
}

Tensor StitchPair::stitched_logits(const Stitch& stitch, const Tensor& raw) const {
  return end_.model->forward_from(stitch.forward(front_features(raw)), end_block_);
}

Tensor select_rows(const Tensor& batch, const std::vector<int64_t>& indices) {
  const Tensor t = batch.contiguous();
  Shape shape = t.shape();
  const int64_t per = shape[0] > 0 ? t.numel() / shape[0] : 0;
  shape[0] = int64_t(indices.size());
  Tensor out = Tensor::empty(shape);
  for (size_t k = 0; k < indices.size(); ++k) {
    check(indices[k] >= 0 && indices[k] < t.size(0), "select_rows: index ", indices[k], " outside a batch of ", t.size(0));
    std::copy(t.data() + indices[k] * per, t.data() + (indices[k] + 1) * per, out.data() + int64_t(k) * per);
  }
  return out;
}

Tensor select_rows(const Tensor& batch, int64_t begin, int64_t end) {
  std::vector<int64_t> indices;
  for (int64_t i = begin; i < end; ++i) indices.push_back(i);
  return select_rows(batch, indices);
}

}  // namespace adjoint
