// The alignment objectives a stitch trains on (docs/methods.md §2.2), one table.
//
// Every objective reads the stitched model's path through B and, where it needs them, B's
// own features on the end model's inputs (StitchPair::stitched_path and end_targets: both
// list the stitch point j first and B's logits last). All are means over the batch.
//
//   hlm   hard labels: CE(F(x), y)
//   slm   soft labels: −Σ_c softmax(B(x)/T)_c · log softmax(F(x)/T)_c (no T² factor)
//   dm    direct matching: mean over elements of (S(A_{≤i}(x)) − B_{≤j}(x))²
//   fula  functional latent alignment: Σ_{l=j}^{L−2} w_l · ‖B_{j→l}(S(A_{≤i}(x))) − B_{≤l}(x)‖²
//         / ‖B_{≤l}(x)‖², norms per example (the denominator at least 1e-12), equal
//         weights w_l = 1 by default; without normalisation each term is the elementwise
//         mean squared difference instead. The terms run from the stitch point to B's
//         penultimate block (the head's logits are not a latent).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

struct ObjectiveOptions {
  double temperature = 1.0;          // slm
  std::vector<double> fula_weights;  // one per term l = j..L−2; empty: all 1
  bool fula_normalise = true;        // divide each term by ‖B_{≤l}(x)‖²
};

// Which outputs of B's own path (end_targets: block j's features, the later blocks', the
// logits) an objective's loss reads; the others need not be kept.
enum class EndTargets { none, first, last, all };

struct Objective {
  const char* name;
  const char* help;
  EndTargets reads;  // of B's own path: hlm nothing, dm block j, slm the logits, fula all
  Tensor (*loss)(const std::vector<Tensor>& stitched_path, const std::vector<Tensor>& end_targets,
                 const std::vector<int64_t>& labels, const ObjectiveOptions& options);
};

// The objective called `name`; a UsageError listing the names otherwise.
const Objective& objective(const std::string& name);
std::vector<std::string> objective_names();

}  // namespace adjoint
