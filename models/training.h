// The training loop: epochs of mini-batch steps with a learning-rate schedule, an
// evaluation after every epoch, checkpoints that make --resume continue bit for bit,
// and a per-epoch log. Display is the caller's: progress arrives through a callback.
//
// What a step does is a step function: classification (here), PGD adversarial training
// (analysis/common/robustness.h) and stitch training (analysis/stitching/train.h) are three step
// functions of one loop. run_steps is that loop's core (schedule, batch, zeroed gradients,
// step function, optimizer); train() wraps it in epochs, evaluation, checkpoints and logs.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/loader.h"
#include "engine/data/open.h"
#include "engine/distributed/gradient_buckets.h"
#include "engine/optim.h"
#include "models/model.h"

namespace adjoint {

struct TrainOptions {
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  bool nesterov = true;
  std::string schedule = "cosine";  // cosine | step | constant
  int64_t warmup_steps = 0;
  int64_t step_every = 0;  // step schedule: decay period in steps (0: a third of the run)
  double gamma = 0.1;
  double label_smoothing = 0.0;
  int64_t epochs = 10;
  int64_t max_steps = 0;  // stop after this many steps in all (0: no limit); counted in checkpoints
  int64_t batch_size = 128;
  int64_t data_parallel = 1;  // shards of each batch computed at once in this process, one thread each
  // Fixed parts ("shards") of every global batch, each with its own gradient and BatchNorm
  // statistics, summed in shard order (Sharding). The same shards give the same bits in one
  // process and over any number of ranks dividing them. 0: one shard per --data-parallel
  // thread (refused under mpirun, where the count must be chosen).
  int64_t shards = 0;
  // The size of the buckets the shards' gradients are exchanged in while backward runs
  // (engine/distributed/gradient_buckets.h); it changes the timing, never the weights.
  double bucket_mib = default_bucket_mib;
  bool augment = true;
  // Each training image shrunk to a random fraction of its side in this range and placed at
  // a random position (engine/data/rescale.h); [1, 1]: none.
  RescaleRange random_rescale;
  uint64_t seed = 0;
  int64_t eval_limit = 0;  // evaluate on at most this many test examples (0: all)
  std::string out_dir;     // checkpoints and logs; empty: none written
  int64_t checkpoint_every = 0;  // also save every N steps (0: only at epoch ends)
  // Checkpoints kept for later analysis, in out_dir/checkpoints/step_<step>.safetensors:
  // "every:N" or "log:K" (checkpoint_steps); empty: none. Each holds the optimizer's state,
  // so a run may also be resumed from any of them.
  std::string keep_checkpoints;
  std::string resume;      // a checkpoint of this run to continue from
  std::string continue_from;  // another run's checkpoint to start from, on this run's data
  bool overwrite = false;  // replace a checkpoint already in out_dir (else refused unless resuming it)
};

struct Progress {
  int64_t epoch = 0, epochs = 0;
  int64_t batch = 0, batches = 0;  // within the epoch
  int64_t step = 0, total_steps = 0;
  double loss = 0, accuracy = 0;   // running means over the epoch so far
  double samples_per_second = 0;
  double lr = 0;
  int64_t resumed_from = 0;  // the step this process started from (0: a fresh run)
};

struct EpochRecord {
  int64_t epoch = 0, step = 0;
  double train_loss = 0, train_accuracy = 0;
  double test_loss = 0, test_accuracy = 0;
  double seconds = 0, samples_per_second = 0;
  double lr = 0;
  bool diverged = false;  // the test loss is not finite: training stopped after this epoch
  int64_t batches_per_epoch = 0;  // for training_position (models/checkpoint.h); not logged
  int64_t ranks = 1, shards = 1;  // the processes of the job and the shards of each batch
  // Each rank's gradient exchange in the epoch's last step (logged for sharded runs).
  std::vector<ExchangeCounts> exchange;
};

struct Evaluation {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
};

// What one step reports: the loss summed over the rows it trained on (examples, or tokens
// of a sequence model), the correct predictions among them and the rows.
struct StepOutcome {
  StepOutcome() = default;
  StepOutcome(double loss_sum_, int64_t correct_, int64_t rows_) : loss_sum(loss_sum_), correct(correct_), rows(rows_) {}
  double loss_sum = 0;
  int64_t correct = 0, rows = 0;
  // What this rank's gradient exchange cost in the step (a sharded step; zeros otherwise).
  ExchangeCounts exchange;
  StepOutcome& operator+=(const StepOutcome& o) {
    loss_sum += o.loss_sum, correct += o.correct, rows += o.rows;
    exchange += o.exchange;
    return *this;
  }
};

// A step function: the forward and backward pass of one mini-batch, leaving the batch
// loss's gradient in the trained parameters' .grad. `step` is the step's index in the run
// (for messages, and for randomness a resumed run must draw again the same way).
using StepFunction = std::function<StepOutcome(const Batch& batch, int64_t step)>;

// The core every training loop runs: steps [first, last), each one the learning rate
// schedule.at(step), the loader's next batch, zeroed gradients, `step_function`, the
// optimizer's update, then `after_step(steps done, batch, outcome)`.
void run_steps(Loader& loader, Optimizer& optimizer, const Schedule& schedule, int64_t first, int64_t last,
               const StepFunction& step_function,
               const std::function<void(int64_t, const Batch&, const StepOutcome&)>& after_step);

// How train() trains a model: a step function with what names it in checkpoints.
struct TrainingStep {
  std::string name;  // "classification", "pgd": for messages
  // Written into every checkpoint; a resumed run must have the same values (a different
  // attack would continue a different run).
  std::map<std::string, std::string> metadata;
  std::function<StepOutcome(Model& model, const Batch& batch, int64_t step)> run;
  // Whether `run`, on rank r of K, reads only the rows of that rank's shards (sharding_of:
  // shards r·S/K … (r+1)·S/K − 1), so that the loader decodes no other row.
  bool reads_own_shards_only = false;
  // Metadata keys a checkpoint must hold to be continued by this step: keys first written
  // when what the step computes changed, so that a checkpoint without them was made by the
  // earlier computation and would continue differently.
  std::vector<std::string> required_on_resume;
};

// Sharded data parallelism (docs/cluster.md). Every global batch is cut into `shards`
// contiguous parts by index (shard s holds rows s·n/S … (s+1)·n/S − 1). Each shard's
// gradient (its loss weighted by its share of the rows) and its BatchNorm statistics (a
// fixed "ghost batch": each shard normalises itself) are computed on their own; the shards'
// gradients and updated running statistics are then summed by one fixed pairwise tree over
// the shard indices (tree_sum_rows, engine/distributed/gradient_buckets.h). With K processes (engine/distributed/ranks.h) rank r computes shards
// r·S/K … (r+1)·S/K − 1 with `threads` threads, the ranks gather what they computed in shard
// order, and every rank sums the same tree: the same bits on every rank, at every K
// dividing S, and in one process with S shards.
// The gradients are summed in buckets (engine/distributed/gradient_buckets.h) whose exchange between
// ranks starts while backward still runs; the bucket size changes no bit of the result.
struct Sharding {
  int64_t shards = 1;   // S: parts of every global batch
  int64_t threads = 1;  // shards computed at once in this process
  double bucket_mib = default_bucket_mib;  // --bucket-mib
};
// The sharding a run of `o` uses in this job; UsageError when the ranks do not divide the
// shards or when, under mpirun, --shards was not given.
Sharding sharding_of(const TrainOptions& o);

// The rows [begin, end) of shard `shard` of `shards` in a batch of `rows`:
// shard·rows/S … (shard+1)·rows/S − 1.
struct RowRange {
  int64_t begin = 0, end = 0;
};
RowRange shard_rows(int64_t rows, int64_t shard, int64_t shards);
// The shards rank `rank` of `ranks` computes: first … first + count − 1, that is
// rank·S/K … (rank+1)·S/K − 1. local_shards: this process's in this job.
struct ShardBlock {
  int64_t first = 0, count = 1;
};
ShardBlock shards_of_rank(const Sharding& sharding, int64_t rank, int64_t ranks);
ShardBlock local_shards(const Sharding& sharding);
// The rows of every batch that rank `rank` of `ranks` decodes and augments to train with
// `step`: those of its own shards when the step reads no others (reads_own_shards_only),
// else every row.
LoaderOptions::Rows rows_to_decode(const TrainingStep& step, const Sharding& sharding, int64_t rank, int64_t ranks);

// The classification step: cross-entropy with o.label_smoothing on the batch as it comes,
// computed in the shards of sharding_of(o).
TrainingStep classification_step(const TrainOptions& o);
// What the sharded step keeps between steps about its gradient buckets, and reports.
struct GradientBuckets {
  // The order backward finished the parameters in at the first step (rank 0's, the same on
  // every rank), which sets the buckets of the steps after it; empty: last to first.
  std::vector<int64_t> order;
  int64_t buckets = 0;  // in the last step
  // Of those, the buckets whose all-gather started before this process's last backward
  // returned (overlapped with it; with shards computed in turn, only the last one overlaps).
  int64_t started_during_backward = 0;
  ExchangeCounts counts;  // this rank's exchange in the last step
};

// One such step on `batch`; throws naming `step` (on every rank) when the loss is not finite.
// `replicas`: where a model with running statistics (BatchNorm) keeps copies of itself for
// threads after the first, kept between steps (made when needed); null: its shards run in turn.
// `buckets`: kept between steps (null: the buckets follow the parameters last to first).
StepOutcome classification_step(Model& model, const Batch& batch, float label_smoothing, const Sharding& sharding,
                                int64_t step, std::vector<std::shared_ptr<Model>>* replicas = nullptr,
                                GradientBuckets* buckets = nullptr);
// The same with `parts` shards computed at once.
StepOutcome classification_step(Model& model, const Batch& batch, float label_smoothing, int64_t parts, int64_t step);

// Accuracy and mean cross-entropy of `model` (eval mode, no autograd) on `data`, each
// batch run as `parts` parts at once, one thread each.
Evaluation evaluate(const Model& model, std::shared_ptr<const Dataset> data, const Transforms& transforms,
                    int64_t batch_size, int64_t limit = 0, int64_t parts = 1);
// The same with each batch in `sharding.shards` parts, `sharding.threads` at once, and the
// batches spread over the ranks of the job; the per-part sums are gathered and added in
// batch order, so the figures are the single process's exactly.
Evaluation evaluate(const Model& model, std::shared_ptr<const Dataset> data, const Transforms& transforms,
                    int64_t batch_size, int64_t limit, const Sharding& sharding);

// Trains `model` (freshly built; options.resume restores it) with `step` and returns one
// record per finished epoch. `on_progress` is called after every step; `on_epoch` after
// every evaluation. A run whose test loss is not finite stops after that epoch, its last
// record marked `diverged`, without checkpointing it.
std::vector<EpochRecord> train(Model& model, const DataSource& data, const TrainOptions& options,
                               const TrainingStep& step,
                               const std::function<void(const Progress&)>& on_progress = {},
                               const std::function<void(const EpochRecord&)>& on_epoch = {});
// The same with classification_step(options).
std::vector<EpochRecord> train(Model& model, const DataSource& data, const TrainOptions& options,
                               const std::function<void(const Progress&)>& on_progress = {},
                               const std::function<void(const EpochRecord&)>& on_epoch = {});

// The steps at which a run of `total_steps` keeps a checkpoint: "every:N" (N, 2N, ... and the
// last step) or "log:K" (K steps spaced evenly in log(step) from 1 to the last, fewer when
// they coincide). Throws UsageError naming the spec when malformed.
std::vector<int64_t> checkpoint_steps(const std::string& spec, int64_t total_steps);

// The file a kept checkpoint of `step` is written to inside a run folder.
std::string kept_checkpoint_path(const std::string& out_dir, int64_t step);

// Fills in a model config's data-dependent fields (channels, size, classes, input size).
void fit_config_to_data(ModelConfig& config, const DataSource& data);

}  // namespace adjoint
