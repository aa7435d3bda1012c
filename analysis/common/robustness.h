// Adversarial robustness: PGD attacks (Madry et al. 2018), PGD adversarial training as a
// step function of the training loop, and the accuracy-versus-ε curve with its area and
// rAuA (docs/methods.md §2.4).
//
// Attacks live in raw pixel space, images in [0, 1]: ε is in pixel units whatever the
// model's input normalisation, which the classifier applies itself (normalise_pixels). PGD
// maximises the cross-entropy of the true label from the clean image x (or a random point
// of the ε-set around it) with `steps` steps of the input-space optimiser
// (analysis/common/input_search.h), each followed by the projection back onto the ε-set and the
// clamp into [0, 1]; the attack is the last iterate, as in Madry et al.
//
//   norm   step rule                       projection onto the ε-set around x
//   linf   x ← x + α·sign(∇)               δ clipped to [−ε, ε] per pixel
//   l2     x ← x + α·∇/‖∇‖₂ per example     δ scaled down to ‖δ‖₂ = ε when longer
//
// Random starts: uniform in the ε-box (linf), uniform on the ε-sphere (l2).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "models/training.h"

namespace adjoint {

struct PgdOptions {
  std::string norm = "linf";  // linf | l2
  float eps = 0.1f;           // radius of the ε-set, in [0, 1] pixel units
  int64_t steps = 5;
  float step_size = 0.0f;     // α; ≤ 0: 2.5·ε/steps (Madry et al.'s rule of thumb)
  bool random_start = false;
  uint64_t seed = 0;          // the random start
};

// The norms' names, for --help and errors.
std::vector<std::string> pgd_norm_names();
// Throws UsageError naming the option (--pgd-norm, --pgd-eps, ...) on an unknown norm or a
// value out of range.
void check_pgd_options(const PgdOptions& options);
// The step size PGD uses: options.step_size, or 2.5·ε/steps when it is ≤ 0.
float pgd_step_size(const PgdOptions& options);

// Logits of a classifier on raw images in [0, 1], recorded (the attack differentiates it).
using RawClassifier = std::function<Tensor(const Tensor& raw)>;

// Adversarial examples of `raw` (N, ...) in [0, 1] against `logits` for `labels`. The
// classifier must be in eval mode (examples independent). ε = 0 or 0 steps: x itself.
Tensor pgd_attack(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels,
                  const PgdOptions& options);

// The same with each example's random start drawn from a generator of its own, keyed by
// (options.seed, draw, keys[n]) instead of by its place in `raw`: an example starts at the
// same point whatever else is attacked with it, on whichever rank. PGD training keys by
// (step, dataset index).
Tensor pgd_attack_keyed(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels,
                        const PgdOptions& options, int64_t draw, const std::vector<int64_t>& keys);

// The cross-entropy of every example (N values, recorded): the loss PGD ascends.
Tensor per_example_cross_entropy(const Tensor& logits, const std::vector<int64_t>& labels);

// (raw − mean) / std per channel (empty: none), recorded so that gradients reach the raw
// pixels. `who` begins the message that refuses images not shaped (N, C, H, W).
Tensor normalise_pixels(const Tensor& raw, const std::vector<float>& mean, const std::vector<float>& std,
                        const std::string& who);
// Raw images from a batch the data pipeline normalised ((x·std + mean) per channel: the
// inverse of normalise_pixels); `who` as there.
Tensor raw_pixels(const Tensor& normalised, const std::vector<float>& mean, const std::vector<float>& std,
                  const std::string& who);

// The share of `raw` images whose arg-max logit under `logits` equals the label, in batches.
double accuracy(const std::function<Tensor(const Tensor&)>& logits, const Tensor& raw,
                const std::vector<int64_t>& labels, int64_t batch = 256);

// PGD adversarial training (Madry et al.): every batch is attacked under `pgd` and the
// classification step runs on the attacked batch. The model is in eval mode while it is
// attacked, as in the robustness library (madrylab/robustness: AttackerModel switches to
// eval for the attack): BatchNorm uses its running statistics and leaves them alone,
// dropout is off, and each example's attack is its own; the step itself is in train
// mode. `mean` and `std` are the data's normalisation (the batches arrive normalised).
// The batch is attacked shard by shard (the shards of sharding_of(options); one shard:
// the whole batch), and each rank attacks only its own shards (reads_own_shards_only:
// its loader decodes no other row). Each example's random start is keyed by (pgd.seed,
// step, its dataset index), so it is the same at any rank count and a resumed run draws
// it again. The attack settings are the step's checkpoint metadata (train.adversarial,
// train.pgd-*, train.shards).
TrainingStep adversarial_training_step(const TrainOptions& options, const PgdOptions& pgd,
                                       const std::vector<float>& mean, const std::vector<float>& std);

// The accuracy under PGD at each ε of `grid` (ε = 0: clean accuracy), on `raw` in batches
// of `batch`; every other setting from `attack`.
std::vector<double> robust_accuracy(const RawClassifier& logits, const Tensor& raw, const std::vector<int64_t>& labels,
                                    const std::vector<float>& grid, const PgdOptions& attack, int64_t batch = 256);

// The area under the accuracy-versus-ε curve by the trapezoid rule over `grid`
// (increasing, at least two points): AuA. rAuA = AuA(stitched) / AuA(end model).
double area_under_accuracy(const std::vector<float>& grid, const std::vector<double>& accuracy);

// Checks an ε grid: finite, non-negative, strictly increasing, at least two values;
// throws UsageError naming `option` otherwise.
void check_eps_grid(const std::vector<float>& grid, const std::string& option);

}  // namespace adjoint
