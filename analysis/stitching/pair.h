// What is stitched to what: a front model A cut after its block i and an end model B
// entered after its block j (docs/methods.md §2.1), each with the normalisation its inputs
// need. Inputs everywhere in stitching are raw images in [0, 1], so that A and B may be
// normalised differently and identically represented inputs live in one pixel space.
//
// Block indices are those of Model::blocks(); a stitch point must leave at least one block
// of the model after it (the head), so i ≤ L_A − 2 and j ≤ L_B − 2. The stitch output stands
// in for B's block-j output: the stitched model is F(x) = B_{>j}(S(A_{≤i}(x))).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "analysis/stitching/layer.h"
#include "models/model.h"

namespace adjoint {

// One of the two frozen models.
struct Endpoint {
  std::string name;               // what messages call it (the checkpoint path)
  std::shared_ptr<Model> model;   // used in eval mode and never changed
  std::vector<float> mean, std;   // per-channel normalisation of its inputs (empty: none)
  // The content hash of its checkpoint (file_hash, analysis/stitching/records.h), which the
  // sweep's records name it by; empty: the hash of the file `name` names, if any.
  std::string checksum = {};
  // (raw − mean) / std per channel, recorded so that gradients reach the raw pixels.
  Tensor input(const Tensor& raw) const;
};

class StitchPair {
public:
  // Checks both models are in eval mode and both blocks in range, and probes the feature
  // shapes with one example of `input_example` (C, H, W). Throws Error naming the models,
  // blocks and shapes.
  StitchPair(Endpoint front, size_t front_block, Endpoint end, size_t end_block, const Shape& input_example);

  const Endpoint& front() const { return front_; }
  const Endpoint& end() const { return end_; }
  size_t front_block() const { return front_block_; }
  size_t end_block() const { return end_block_; }
  // The shapes a stitch between the two blocks joins, with `where` filled in.
  const StitchShapes& shapes() const { return shapes_; }

  // A_{≤i}(raw): recorded when autograd is on (IRIs differentiate through it).
  Tensor front_features(const Tensor& raw) const;
  // B_{≤l}(raw) for l = j .. L_B − 1 (the last are B's logits), without autograd: the
  // targets of the objectives.
  std::vector<Tensor> end_targets(const Tensor& raw) const;
  // The stitched model's path on front features h: element 0 is S(h) (standing for B's
  // block-j output), element k the output of B's block j + k; the last are the logits.
  std::vector<Tensor> stitched_path(const Stitch& stitch, const Tensor& front_features) const;
  // F(raw) = B_{>j}(S(A_{≤i}(raw))).
  Tensor stitched_logits(const Stitch& stitch, const Tensor& raw) const;

private:
  Endpoint front_, end_;
  size_t front_block_, end_block_;
  StitchShapes shapes_;
};

// The examples `indices` of a batch (N, ...), copied into a new batch.
Tensor select_rows(const Tensor& batch, const std::vector<int64_t>& indices);
// Examples [begin, end) of a batch, copied.
Tensor select_rows(const Tensor& batch, int64_t begin, int64_t end);

}  // namespace adjoint
