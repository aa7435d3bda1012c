#include "analysis/stitching_train.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/random.h"

namespace adjoint {

StitchTrainResult train_stitch(Stitch& stitch, const StitchPair& pair, const StitchTrainingSet& data,
                               const StitchTrainOptions& o, const std::function<void(int64_t, int64_t, double)>& progress) {
  const Objective& objective = adjoint::objective(o.objective);
  const int64_t N = data.front_inputs.defined() ? data.front_inputs.size(0) : 0;
  check(N > 0, "stitch training ", pair.shapes().where, ": the training set is empty");
  check(data.end_inputs.defined() && data.end_inputs.shape() == data.front_inputs.shape() &&
            int64_t(data.labels.size()) == N,
        "stitch training: front inputs ", data.front_inputs.shape(), ", end inputs ",
        data.end_inputs.defined() ? data.end_inputs.shape() : Shape{}, " and ", data.labels.size(), " labels disagree");
  check(o.epochs >= 1 && o.batch >= 1, "stitch training: epochs and batch must be positive, got ", o.epochs, " and ",
        o.batch);
  AdamWOptions adam;
  adam.lr = o.lr;
  adam.weight_decay = o.weight_decay;
  AdamW optimizer(stitch.named_parameters(), adam);
  Generator order(o.seed);
  const int64_t batches = (N + o.batch - 1) / o.batch, total = batches * o.epochs;
  StitchTrainResult result;
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    const std::vector<int64_t> shuffled = permutation(N, order);
    double loss_sum = 0;
    for (int64_t b = 0; b < batches; ++b) {
      const std::vector<int64_t> indices(shuffled.begin() + b * o.batch,
                                         shuffled.begin() + std::min(N, (b + 1) * o.batch));
      std::vector<int64_t> labels;
      for (int64_t i : indices) labels.push_back(data.labels[size_t(i)]);
      Tensor front;
      {
        NoGrad off;
        front = pair.front_features(select_rows(data.front_inputs, indices));
      }
      std::vector<Tensor> targets;
      if (objective.needs_end_features) targets = pair.end_targets(select_rows(data.end_inputs, indices));
      const Tensor loss = objective.loss(pair.stitched_path(stitch, front), targets, labels, o.objective_options);
      const std::vector<Tensor> g = grad(loss, {stitch.weight, stitch.bias}, {}, {}, false);
      stitch.weight.set_grad(g[0]);
      stitch.bias.set_grad(g[1]);
      optimizer.step();
      const double value = loss.item();
      loss_sum += value;
      ++result.steps;
      if (progress) progress(result.steps, total, value);
    }
    result.last_epoch_loss = loss_sum / double(batches);
  }
  return result;
}

double accuracy(const std::function<Tensor(const Tensor&)>& logits, const Tensor& raw,
                const std::vector<int64_t>& labels, int64_t batch) {
  const int64_t N = raw.defined() ? raw.size(0) : 0;
  check(N > 0 && int64_t(labels.size()) == N, "accuracy: ", N, " images and ", labels.size(), " labels");
  NoGrad off;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < N; begin += batch) {
    const int64_t end = std::min(N, begin + batch);
    const Tensor out = logits(select_rows(raw, begin, end)).contiguous();
    const int64_t C = out.size(1);
    for (int64_t n = 0; n < end - begin; ++n) {
      const float* row = out.data() + n * C;
      correct += (std::max_element(row, row + C) - row) == labels[size_t(begin + n)];
    }
  }
  return double(correct) / double(N);
}

}  // namespace adjoint
