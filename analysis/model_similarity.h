// Two bilinear models compared: tensor similarity from their weights (the closed form for
// one bilinear layer, the second-moment recursion for deeper networks) with the baselines
// of METHODS.md §3.4 beside it, computed on a batch of inputs. What `adjoint tensorsim`
// prints and writes, for one pair of checkpoints or every checkpoint of a run.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "models/model.h"

namespace adjoint {

struct TensorSimOptions {
  std::string metric = "gaussian";  // identity | gaussian (one bilinear layer); deep networks: gaussian
  bool bias = true;                 // include the constant coordinate x̃_0 = 1
  int64_t positions = 0;            // sequence models: positions compared (0: the model's context)
};

struct TensorSimScore {
  std::string method;          // "closed form, gaussian metric" or "second-moment recursion"
  double total = 0;
  std::vector<double> slices;  // per output (class, token), summed over positions
};

// Tensor similarity of two models' polynomials; `reference`, when given, compares
// (a − reference) against b (the difference tensor: what changed since the reference).
TensorSimScore tensor_similarity(const Model& a, const Model& b, const TensorSimOptions& options,
                                 const Model* reference = nullptr);

// A data-based or weight-based baseline: name, what it measures, and its value.
struct BaselineScore {
  std::string name, summary;
  double value = 0;
};
// The baselines of the table (all, or those named in `only`), on `inputs` (already
// normalised): linear CKA (biased, debiased) on the hidden features (the output of the
// block before the head) and on the logits, prediction agreement, output correlation,
// weight cosine.
std::vector<BaselineScore> baseline_scores(const Model& a, const Model& b, const Tensor& inputs,
                                           const std::vector<std::string>& only = {});

}  // namespace adjoint
