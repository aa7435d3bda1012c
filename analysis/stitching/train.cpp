#include "analysis/stitching/train.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/data/dataset.h"
#include "engine/data/loader.h"
#include "models/training.h"

namespace adjoint {

namespace {

// A and B are frozen and the training images fixed, so A's features and B's targets of an
// example are the same in every epoch. They are computed once, in batches, when they fit
// in `budget_bytes`; otherwise every step computes those of its batch. Only the targets the
// objective reads are kept (slm: the logits alone, not every block's features).
struct FrozenPasses {
  Tensor front;                // (N, *front example) or undefined: computed per batch
  std::vector<Tensor> targets;  // B's outputs from block j on, each (N, ...) or undefined when
                                // not read; empty: per batch

  FrozenPasses(const StitchPair& pair, const StitchTrainingSet& data, EndTargets reads, int64_t budget_bytes,
               int64_t batch) {
    if (budget_bytes <= 0) return;
    NoGrad off;
    const int64_t N = data.front_inputs.size(0);
    int64_t per_example = numel(pair.shapes().front);
    std::vector<Shape> target_shapes;  // of every output of B's path, with N rows
    std::vector<bool> kept;
    if (reads != EndTargets::none) {
      const std::vector<Tensor> one = pair.end_targets(select_rows(data.end_inputs, 0, 1));
      for (size_t l = 0; l < one.size(); ++l) {
        kept.push_back(reads == EndTargets::all || (reads == EndTargets::first && l == 0) ||
                       (reads == EndTargets::last && l + 1 == one.size()));
        target_shapes.push_back(one[l].shape());
        target_shapes.back()[0] = N;
        if (kept.back()) per_example += one[l].numel();
      }
    }
    if (per_example * N * int64_t(sizeof(float)) > budget_bytes) return;
    Shape front_shape = pair.shapes().front;
    front_shape.insert(front_shape.begin(), N);
    front = Tensor::empty(front_shape);
    for (size_t l = 0; l < target_shapes.size(); ++l)
      targets.push_back(kept[l] ? Tensor::empty(target_shapes[l]) : Tensor());
    for (int64_t begin = 0; begin < N; begin += batch) {
      const int64_t end = std::min(N, begin + batch);
      copy_rows(pair.front_features(select_rows(data.front_inputs, begin, end)), front, begin);
      if (reads != EndTargets::none) {
        const std::vector<Tensor> t = pair.end_targets(select_rows(data.end_inputs, begin, end));
        for (size_t l = 0; l < t.size(); ++l)
          if (targets[l].defined()) copy_rows(t[l], targets[l], begin);
      }
    }
  }

  // The rows of `part` into `all`, from row `at` on.
  static void copy_rows(const Tensor& part, Tensor& all, int64_t at) {
    const Tensor c = part.contiguous();
    std::copy(c.data(), c.data() + c.numel(), all.data() + at * (all.numel() / all.size(0)));
  }
};

}  // namespace

StitchTrainResult train_stitch(Stitch& stitch, const StitchPair& pair, const StitchTrainingSet& data,
                               const StitchTrainOptions& o, const std::function<void(int64_t, int64_t, double)>& progress) {
  const Objective& objective = adjoint::objective(o.objective);
  const int64_t N = data.front_inputs.defined() ? data.front_inputs.size(0) : 0;
  check(N > 0, "stitch training ", pair.shapes().where, ": the training set is empty");
  check(data.end_inputs.defined() && data.end_inputs.shape() == data.front_inputs.shape() &&
            int64_t(data.labels.size()) == N,
        "stitch training: front inputs ", data.front_inputs.shape(), ", end inputs ",
        data.end_inputs.defined() ? data.end_inputs.shape() : Shape{}, " and ", data.labels.size(), " labels disagree");
  check(o.batch >= 1 && o.steps >= 0 && o.epochs >= -1 && std::isfinite(o.lr) && o.lr > 0,
        "stitch training: batch ", o.batch, ", steps ", o.steps, ", epochs ", o.epochs, " and lr ", o.lr,
        "; expected a batch ≥ 1, steps ≥ 0, epochs ≥ 0 (or −1: by steps) and a finite lr > 0");
  AdamWOptions adam;
  adam.lr = o.lr;
  adam.weight_decay = o.weight_decay;
  AdamW optimizer(stitch.named_parameters(), adam);
  Schedule constant;
  constant.kind = Schedule::Constant;
  constant.base_lr = o.lr;
  LoaderOptions batches;
  batches.batch_size = o.batch;
  batches.prefetch = false;  // an in-memory copy costs less than a hand-over
  batches.seed = o.seed;
  // The examples as a data set, so that the training loop's Loader shuffles and batches
  // them: an example is a front image and its label; its index finds the matching end image.
  const Tensor front_images = data.front_inputs.contiguous();
  const int64_t classes = *std::max_element(data.labels.begin(), data.labels.end()) + 1;
  Loader loader(std::make_shared<InMemoryDataset>(
                    "stitch training set", Shape(front_images.shape().begin() + 1, front_images.shape().end()),
                    front_images.to_vector(), data.labels, classes),
                batches);
  const int64_t per_epoch = loader.batches_per_epoch(), total = stitch_steps(o, N);
  StitchTrainResult result;
  if (total == 0) return result;

  // At most one epoch uses every example once: a cache would only add its copies.
  const FrozenPasses frozen(pair, data, objective.reads, total > per_epoch ? o.cache_bytes : 0, o.batch);

  // The stitch step: A's features without autograd, B's targets on the end images of the
  // same examples, and the gradient asked for the stitch's parameters alone.
  auto stitch_step = [&](const Batch& batch, int64_t) {
    Tensor front;
    if (frozen.front.defined()) {
      front = select_rows(frozen.front, batch.indices);
    } else {
      NoGrad off;
      front = pair.front_features(batch.inputs);
    }
    std::vector<Tensor> targets;
    if (!frozen.targets.empty())
      for (const Tensor& t : frozen.targets) targets.push_back(t.defined() ? select_rows(t, batch.indices) : Tensor());
    else if (objective.reads != EndTargets::none)
      targets = pair.end_targets(select_rows(data.end_inputs, batch.indices));
    const Tensor loss = objective.loss(pair.stitched_path(stitch, front), targets, batch.labels, o.objective_options);
    const std::vector<Tensor> g = grad(loss, {stitch.weight, stitch.bias}, {}, {}, false);
    stitch.weight.set_grad(g[0]);
    stitch.bias.set_grad(g[1]);
    const double value = loss.item();
    return StepOutcome{value * double(batch.size()), 0, batch.size()};
  };
  // The final loss: the mean over the last epoch's worth of steps (all of them when fewer).
  const int64_t window = std::min(per_epoch, total);
  double window_loss = 0;
  run_steps(loader, optimizer, constant, 0, total, stitch_step, [&](int64_t done, const Batch& batch, const StepOutcome& r) {
    const double value = r.loss_sum / double(batch.size());
    if (done > total - window) window_loss += value;
    result.steps = done;
    if (progress) progress(done, total, value);
  });
  result.final_loss = window_loss / double(window);
  return result;
}

int64_t stitch_steps(const StitchTrainOptions& o, int64_t examples) {
  if (o.epochs < 0) return o.steps;
  return o.epochs * ((examples + o.batch - 1) / o.batch);
}

}  // namespace adjoint
