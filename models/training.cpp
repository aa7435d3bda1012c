#include "models/training.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "engine/autograd.h"
#include "engine/io/csv.h"
#include "engine/io/table.h"
#include "engine/data/loader.h"
#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/distributed/gradient_buckets.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/optim.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/loss.h"

namespace adjoint {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Logits of a classifier (N, C) or of a sequence model (N, T, C) as rows of (·, C).
Tensor as_rows(const Tensor& logits) {
  return logits.dim() == 2 ? logits : reshape(logits, {-1, logits.size(-1)});
}

// Correct predictions among the rows of (rows, C) logits.
int64_t count_correct(const Tensor& logits, const std::vector<int64_t>& labels) {
  Tensor l = logits.contiguous();
  const int64_t rows = l.size(0), c = l.size(1);
  const float* p = l.data();
  int64_t right = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = p + i * c;
    int64_t best = 0;
    for (int64_t k = 1; k < c; ++k)
      if (row[k] > row[best]) best = k;
    right += best == labels[size_t(i)];
  }
  return right;
}

std::unique_ptr<Optimizer> make_optimizer(const Model& model, const TrainOptions& o) {
  if (o.optimizer == "sgd")
    return std::make_unique<Sgd>(model.named_parameters(), SgdOptions{o.lr, o.momentum, o.weight_decay, o.nesterov});
  if (o.optimizer == "adamw")
    return std::make_unique<AdamW>(model.named_parameters(), AdamWOptions{o.lr, 0.9, 0.999, 1e-8, o.weight_decay});
  throw UsageError(cat("--optimizer: unknown optimizer '", o.optimizer, "' (sgd, adamw)"));
}

Schedule make_schedule(const TrainOptions& o, int64_t total_steps) {
  Schedule s;
  if (o.schedule == "cosine") s.kind = Schedule::Cosine;
  else if (o.schedule == "step") s.kind = Schedule::Step;
  else if (o.schedule == "constant") s.kind = Schedule::Constant;
  else throw UsageError(cat("--schedule: unknown schedule '", o.schedule, "' (cosine, step, constant)"));
  s.base_lr = o.lr;
  s.warmup = o.warmup_steps;
  s.total = total_steps;
  s.step_every = o.step_every > 0 ? o.step_every : std::max<int64_t>(1, total_steps / 3);
  s.gamma = o.gamma;
  return s;
}

std::vector<std::string> csv_row(const EpochRecord& r) {
  return {cat(r.epoch), cat(r.step), csv_number(r.train_loss), csv_number(r.train_accuracy), csv_number(r.test_loss),
          csv_number(r.test_accuracy), csv_number(r.seconds), csv_number(r.samples_per_second), csv_number(r.lr)};
}

Json record_json(const EpochRecord& r) {
  Json record(Json::Object{{"epoch", r.epoch},
                           {"step", r.step},
                           {"train_loss", r.train_loss},
                           {"train_accuracy", r.train_accuracy},
                           {"test_loss", r.test_loss},
                           {"test_accuracy", r.test_accuracy},
                           {"seconds", r.seconds},
                           {"samples_per_second", r.samples_per_second},
                           {"lr", r.lr},
                           {"ranks", r.ranks},
                           {"shards", r.shards}});
  if (!r.exchange.empty()) {
    Json per_rank = Json::array();
    for (const ExchangeCounts& c : r.exchange)
      per_rank.push_back(Json(Json::Object{
          {"bytes_sent", c.bytes_sent}, {"receive_bytes", c.receive_bytes}, {"additions", c.additions}}));
    record["exchange_per_rank"] = per_rank;
  }
  return record;
}

// Every rank's exchange counts (a collective), in rank order.
std::vector<ExchangeCounts> exchange_per_rank(const ExchangeCounts& mine) {
  const double values[3] = {double(mine.bytes_sent), double(mine.receive_bytes), double(mine.additions)};
  std::vector<double> all(size_t(3 * distributed::size()));
  distributed::allgather(values, 3, all.data());
  std::vector<ExchangeCounts> out;
  for (size_t r = 0; r < all.size(); r += 3) out.push_back({int64_t(all[r]), int64_t(all[r + 1]), int64_t(all[r + 2])});
  return out;
}

// The log files of a run: every record so far, rewritten atomically after each epoch.
void write_logs(const std::string& dir, const std::vector<EpochRecord>& records) {
  Table csv{{"epoch", "step", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "seconds",
             "samples_per_second", "lr"}};
  Json json = Json::array();
  for (const auto& r : records) csv.add_row(csv_row(r)), json.push_back(record_json(r));
  write_file_atomic(dir + "/log.csv", csv.csv());
  write_file_atomic(dir + "/log.json", to_json(json, 2) + "\n");
}

// The records of an earlier run's log.json (when resuming); a malformed log is an error
// naming the file rather than a silently restarted log.
std::vector<EpochRecord> read_log(const std::string& dir) {
  const std::string path = dir + "/log.json";
  std::vector<EpochRecord> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Json log = parse_json(text);
  for (const Json& j : log.as_array()) {
    auto field = [&](const char* key) {
      const Json* v = j.find(key);
      check(v != nullptr, path, ": a record has no '", key, "'");
      return v->is_null() ? std::nan("") : v->as_number();  // a diverged epoch's loss is written as null
    };
    EpochRecord r;
    r.epoch = int64_t(field("epoch"));
    r.step = int64_t(field("step"));
    r.train_loss = field("train_loss");
    r.train_accuracy = field("train_accuracy");
    r.test_loss = field("test_loss");
    r.test_accuracy = field("test_accuracy");
    r.seconds = field("seconds");
    r.samples_per_second = field("samples_per_second");
    r.lr = field("lr");
    if (j.find("ranks") && j.find("shards")) r.ranks = int64_t(field("ranks")), r.shards = int64_t(field("shards"));
    out.push_back(r);
  }
  return out;
}

std::string join(const std::vector<float>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += cat(v[i]);
  }
  return s;
}

}  // namespace

std::vector<int64_t> checkpoint_steps(const std::string& spec, int64_t total) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  int64_t n = 0;
  try {
    size_t used = 0;
    const std::string value = colon == std::string::npos ? "" : spec.substr(colon + 1);
    n = std::stoll(value, &used);
    if (used != value.size()) n = 0;
  } catch (const std::exception&) {
    n = 0;
  }
  if ((kind != "every" && kind != "log") || n < 1 || (kind == "log" && n < 2))
    throw UsageError(cat("--keep-checkpoints ", spec, ": expected every:N (N ≥ 1) or log:K (K ≥ 2)"));
  std::vector<int64_t> steps;
  // K so large that consecutive log steps lie less than one step apart everywhere
  // (total·(total^(1/(K−1)) − 1) < 1) keeps every step; said so directly, since looping K
  // times would not end for K = 10^14.
  if (kind == "log" && total > 1 && double(n - 1) * std::log1p(1.0 / double(total)) > std::log(double(total))) {
    for (int64_t s = 1; s <= total; ++s) steps.push_back(s);
    return steps;
  }
  if (kind == "every") {
    for (int64_t s = n; s < total; s += n) steps.push_back(s);
  } else {
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int64_t s = std::llround(std::pow(double(total), double(i) / double(n - 1)));
      if (steps.empty() || s > steps.back()) steps.push_back(s);
    }
  }
  if (total > 0 && (steps.empty() || steps.back() < total)) steps.push_back(total);
  return steps;
}

std::string kept_checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08lld.safetensors", (long long)step);
  return out_dir + name;
}

void fit_config_to_data(ModelConfig& config, const DataSource& data) {
  const Shape s = data.train->shape();
  config.num_classes = data.train->num_classes();
  if (data.images) {
    config.in_channels = s[0];
    config.image_size = s[1];
    check(s[1] == s[2], "data ", data.spec, ": images are ", s[1], "×", s[2], "; models expect square images");
  } else if (config.arch == "bilinear_lm") {
    config.seq_len = s[0];
    config.vocab = data.train->num_classes();
  } else {
    config.in_channels = 1;
    config.image_size = 1;
    config.in_features = numel(s);
  }
}

namespace {

// A part of a batch: a shard of the training step, or a part of an evaluation batch.
struct BatchPart {
  Tensor inputs;
  std::vector<int64_t> labels;
};

int64_t part_count(const Batch& batch, int64_t wanted) {
  return std::clamp<int64_t>(wanted, 1, std::max<int64_t>(batch.size(), 1));
}

// Part `s` of `parts`: the contiguous rows of shard_rows.
BatchPart part_of(const Batch& batch, int64_t s, int64_t parts) {
  if (parts == 1) return BatchPart{batch.inputs, batch.labels};
  const int64_t n = batch.size(), per_example = static_cast<int64_t>(batch.labels.size()) / n;
  const auto [begin, end] = shard_rows(n, s, parts);
  return BatchPart{slice(batch.inputs, 0, begin, end).contiguous(),
                   std::vector<int64_t>(batch.labels.begin() + begin * per_example,
                                        batch.labels.begin() + end * per_example)};
}

// Runs task(0) … task(count − 1) on `threads` threads at once, each taking a contiguous
// block of the tasks in turn; directly on this thread when there is one. Which thread runs
// a task never changes what it computes, so results do not depend on `threads`.
// task(thread, i): the thread's index, 0 … threads − 1, for state of its own.
void run_in_blocks(int64_t count, int64_t threads, const std::function<void(int64_t, int64_t)>& task) {
  threads = std::clamp<int64_t>(threads, 1, std::max<int64_t>(count, 1));
  if (threads == 1) {
    for (int64_t i = 0; i < count; ++i) task(0, i);
    return;
  }
  run_concurrently(threads, [&](int64_t t) {
    for (int64_t i = t * count / threads; i < (t + 1) * count / threads; ++i) task(t, i);
  });
}
void run_in_blocks(int64_t count, int64_t threads, const std::function<void(int64_t)>& task) {
  run_in_blocks(count, threads, [&](int64_t, int64_t i) { task(i); });
}

int64_t total_numel(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

// The tensors' values one after another into `out`, and back.
void flatten_into(const std::vector<Tensor>& tensors, float* out) {
  for (const Tensor& t : tensors) {
    copy_to_dense(t, out);
    out += t.numel();
  }
}
void unflatten_into(const float* values, std::vector<Tensor>& tensors) {
  for (Tensor& t : tensors) {
    std::copy(values, values + t.numel(), t.data());
    values += t.numel();
  }
}

// Shards would draw a dropout mask from one generator in turn (from several threads, or on
// some ranks only), so the masks would depend on the threads and ranks. (BatchNorm is
// exact: each shard normalises itself and its running statistics are combined in order.)
void check_data_parallel(const Model& model, int64_t parts) {
  if (parts <= 1) return;
  const ModelConfig& c = model.config();
  const bool dropout = model.facts().has_dropout;
  if (dropout)
    throw UsageError(cat("--shards ", parts, ": ", c.arch,
                         " has dropout, whose generator would be advanced by every shard of the batch; use 1"));
}

// Options that would fail at the first step or train nonsense, refused before any work:
// each must be finite and within its range.
void check_options(const TrainOptions& o) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  struct Range {
    const char* option;
    double value, low, high;
    bool low_excluded;
  };
  const Range ranges[] = {
      {"--lr", o.lr, 0, inf, true},
      {"--momentum", o.momentum, 0, 1, false},
      {"--weight-decay", o.weight_decay, 0, inf, false},
      {"--label-smoothing", o.label_smoothing, 0, 1, false},
      {"--warmup", double(o.warmup_steps), 0, inf, false},
      {"--max-steps", double(o.max_steps), 0, inf, false},
      {"--eval-limit", double(o.eval_limit), 0, inf, false},
      {"--checkpoint-every", double(o.checkpoint_every), 0, inf, false},
  };
  for (const Range& r : ranges) {
    const bool above_low = r.low_excluded ? r.value > r.low : r.value >= r.low;
    if (!(std::isfinite(r.value) && above_low && r.value <= r.high))
      throw UsageError(cat("option ", r.option, " must be a finite number ", r.low_excluded ? "above " : "at least ",
                           r.low, r.high < inf ? cat(" and at most ", r.high) : "", ", got ", r.value));
  }
}

// The options a resumed run must share with the run that wrote the checkpoint, each with
// the metadata key it is stored under: with another value the continuation would differ
// from an uninterrupted run without a word.
std::vector<std::pair<std::string, std::string>> resume_keys(const TrainOptions& o, const DataSource& data,
                                                             const TrainingStep& step) {
  // The shortest text that reads back as the same double, so that 0.1 and 0.1000001 differ.
  auto exact = [](double v) {
    char text[64];
    return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
  };
  std::vector<std::pair<std::string, std::string>> keys = {{"train.optimizer", o.optimizer},
                                                           {"seed", std::to_string(o.seed)},
                                                           {"train.batch", std::to_string(o.batch_size)},
                                                           {"data.spec", data.spec},
                                                           {"train.lr", exact(o.lr)},
                                                           {"train.weight-decay", exact(o.weight_decay)},
                                                           {"train.schedule", o.schedule},
                                                           {"train.warmup", std::to_string(o.warmup_steps)},
                                                           {"train.label-smoothing", exact(o.label_smoothing)},
                                                           {"train.random-rescale", to_string(o.random_rescale)}};
  if (o.schedule == "step") {
    keys.emplace_back("train.step-every", std::to_string(o.step_every));
    keys.emplace_back("train.gamma", exact(o.gamma));
  }
  if (o.optimizer == "sgd") {
    keys.emplace_back("train.momentum", exact(o.momentum));
    keys.emplace_back("train.nesterov", o.nesterov ? "yes" : "no");
  }
  keys.insert(keys.end(), step.metadata.begin(), step.metadata.end());
  return keys;
}

// Refuses a checkpoint this run cannot continue bit for bit, naming the option that
// differs or what is missing. Checkpoints from before a key was stored skip its check.
void check_resumable(const Checkpoint& ck, const Model& model, const TrainOptions& o, const DataSource& data,
                     const TrainingStep& step) {
  const std::string at = cat("--resume ", o.resume, ": ");
  check(ck.config.arch == model.config().arch, at, "checkpoint holds a ", ck.config.arch, ", this run trains a ",
        model.config().arch);
  for (const std::string& key : step.required_on_resume)
    if (!ck.metadata.count(key))
      throw UsageError(cat(at, "the checkpoint records no ", key, ": it was written by an earlier ", step.name,
                           " step, which this build cannot continue bit for bit; start a new run"));
  for (const auto& [key, value] : resume_keys(o, data, step)) {
    auto it = ck.metadata.find(key);
    const std::string option = key == "data.spec" ? "data" : key.substr(key.find('.') + 1);
    if (it != ck.metadata.end() && it->second != value)
      throw UsageError(cat(at, "the checkpoint was trained with --", option, " ", it->second, ", this run has --",
                           option, " ", value, "; resume with the same options"));
  }
  const bool has_state = o.optimizer == "adamw" || o.momentum != 0;
  auto saved = ck.metadata.find("train.optimizer_tensors");
  if (saved != ck.metadata.end() && saved->second != std::to_string(ck.optimizer.size()))
    throw Error(cat(at, "the checkpoint holds ", ck.optimizer.size(), " optimizer tensors but ", saved->second,
                    " were saved (a damaged or edited file)"));
  if (has_state && ck.step > 0 && ck.optimizer.empty())
    throw Error(cat(at, "the checkpoint holds no optimizer state (momentum / moments), so a resumed run would differ "
                    "from an uninterrupted one; use it as --weights of a new run instead"));
}

// Refuses a resume whose run ends at another step (--max-steps or --epochs changed) where
// the schedule is shaped by the run's length: a cosine, or a step schedule in thirds of the
// run. Its learning rates would follow another curve from the resumed step on, and the run
// would match neither the first nor an uninterrupted longer one. Checkpoints from before the
// end was stored are not checked.
void check_schedule_end(const Checkpoint& ck, const TrainOptions& o, int64_t total) {
  const bool shaped_by_length = o.schedule == "cosine" || (o.schedule == "step" && o.step_every == 0);
  const auto saved = ck.metadata.find("train.total_steps");
  if (!shaped_by_length || saved == ck.metadata.end() || saved->second == std::to_string(total)) return;
  throw UsageError(cat("--resume ", o.resume, ": the checkpoint's run ends its ", o.schedule, " schedule at step ",
                       saved->second, ", this run at step ", total,
                       ", so the learning rate would change course; resume with the same --epochs and --max-steps, or "
                       "start a longer run from it with --continue-from"));
}

// Refuses a checkpoint another optimizer wrote (--continue-from): its state (momentum or
// Adam's moments) cannot carry over, and dropping it silently would hide that the new run
// starts cold.
void check_continuable(const Checkpoint& ck, const Model& model, const TrainOptions& o) {
  const std::string at = cat("--continue-from ", o.continue_from, ": ");
  check(ck.config.arch == model.config().arch, at, "checkpoint holds a ", ck.config.arch, ", this run trains a ",
        model.config().arch);
  const auto saved = ck.metadata.find("train.optimizer");
  if (saved != ck.metadata.end() && saved->second != o.optimizer)
    throw UsageError(cat(at, "the checkpoint was trained with --optimizer ", saved->second, ", this run uses ",
                         o.optimizer, ", whose state (momentum, moments) cannot carry over and would be dropped; continue with "
                         "--optimizer ", saved->second));
}

// Refuses to replace the checkpoint of another run in the output folder (unless this run
// resumes it, or --overwrite), and removes the temporary files that writers killed
// there (kill -9, a crash) left behind.
void check_out_dir(const TrainOptions& o, const std::string& checkpoint_path) {
  namespace fs = std::filesystem;
  if (o.out_dir.empty()) return;
  if (fs::exists(checkpoint_path) && !o.overwrite) {
    const bool resuming_it = !o.resume.empty() && fs::exists(o.resume) && fs::equivalent(o.resume, checkpoint_path);
    if (!resuming_it)
      throw UsageError(cat("--out ", o.out_dir, " already holds checkpoint.safetensors; give --resume ",
                           checkpoint_path, " to continue that run, or --overwrite to replace it"));
  }
  if (fs::is_directory(o.out_dir) && distributed::rank() == 0) remove_stale_temporaries(o.out_dir);
}

}  // namespace

Sharding sharding_of(const TrainOptions& o) {
  const int64_t ranks = distributed::size();
  if (o.shards < 0) throw UsageError(cat("--shards must be at least 1, got ", o.shards));
  if (o.shards == 0 && ranks > 1)
    throw UsageError(cat("mpirun -n ", ranks, ": give --shards S, a multiple of ", ranks,
                         " (the same S gives the same weights at any rank count dividing it)"));
  if (!(o.bucket_mib > 0 && std::isfinite(o.bucket_mib)))
    throw UsageError(cat("--bucket-mib must be a positive number of MiB, got ", o.bucket_mib));
  Sharding sharding{o.shards > 0 ? o.shards : o.data_parallel, o.data_parallel, o.bucket_mib};
  if (sharding.shards % ranks != 0)
    throw UsageError(cat("--shards ", sharding.shards, ": not a multiple of the ", ranks,
                         " ranks; each rank computes the same number of shards"));
  return sharding;
}

RowRange shard_rows(int64_t rows, int64_t shard, int64_t shards) {
  return {shard * rows / shards, (shard + 1) * rows / shards};
}

ShardBlock shards_of_rank(const Sharding& sharding, int64_t rank, int64_t ranks) {
  const int64_t mine = sharding.shards / ranks;
  return {rank * mine, mine};
}

ShardBlock local_shards(const Sharding& sharding) {
  return shards_of_rank(sharding, distributed::rank(), distributed::size());
}

LoaderOptions::Rows rows_to_decode(const TrainingStep& step, const Sharding& sharding, int64_t rank, int64_t ranks) {
  if (!step.reads_own_shards_only) return {};
  const ShardBlock mine = shards_of_rank(sharding, rank, ranks);
  return {sharding.shards, mine.first, mine.count};
}

namespace {

// Runs `exchange` (a part of training that waits for other ranks); a rank that does not
// arrive within the deadline ends it with one line naming that rank and `what` it owed
// ("its part of step 3").
template <class Work>
auto naming_missing_rank(const std::string& what, Work&& exchange) {
  try {
    return exchange();
  } catch (const distributed::RankTimeout& e) {
    throw distributed::RankTimeout(e.missing, cat("train: rank ", e.missing, " did not send ", what, " within ",
                                                  distributed::rank_timeout(), " s (--rank-timeout)"));
  }
}

// The whole batch at once, its gradient straight into .grad and BatchNorm's running
// statistics updated in place: one shard in one process.
StepOutcome whole_batch_step(Model& model, const Batch& batch, float label_smoothing, int64_t step) {
  GradientOnly training_graph;  // this graph only ever takes the exact gradient
  Tensor logits = as_rows(model.forward(batch.inputs));
  Tensor loss = cross_entropy(logits, batch.labels, label_smoothing);
  const float value = loss.item();
  check(std::isfinite(value), "train: diverged: the training loss became ", csv_number(value), " at step ", step,
        "; lower --lr or check the data");
  backward(loss);
  NoGrad off;
  const int64_t rows = logits.size(0);
  return {double(value) * double(rows), count_correct(logits, batch.labels), rows};
}

// The order the tensors summed over the shards are expected to become final in, before a
// step has shown it: the parameters last to first (backward runs the last layers first, as
// DDP assumes too), then the running statistics, added after backward.
std::vector<int64_t> default_summation_order(size_t parameters, size_t statistics) {
  std::vector<int64_t> order;
  for (size_t i = parameters; i-- > 0;) order.push_back(int64_t(i));
  for (size_t b = 0; b < statistics; ++b) order.push_back(int64_t(parameters + b));
  return order;
}

// Rank 0's `order`, on every rank: the buckets (the collectives every rank starts) must be
// the same everywhere, whatever order each rank happened to see.
std::vector<int64_t> rank_zeros_order(const std::vector<int64_t>& order) {
  std::string text;
  for (int64_t index : order) text += std::to_string(index) + " ";
  distributed::broadcast(text);
  std::vector<int64_t> agreed;
  for (size_t at = 0; at < text.size();) {
    const size_t space = text.find(' ', at);
    agreed.push_back(std::stoll(text.substr(at, space - at)));
    at = space + 1;
  }
  return agreed;
}

std::vector<Tensor> buffers_of(const Model& model) {
  std::vector<Tensor> out;
  for (const auto& [name, buffer] : model.named_buffers()) out.push_back(buffer);
  return out;
}

// `count` replicas of `model` (made the first time) holding its parameters' values now.
void refresh_replicas(const Model& model, int64_t count, std::vector<std::shared_ptr<Model>>& replicas) {
  NoGrad off;
  while (int64_t(replicas.size()) < count) {
    Generator unused(0);  // the values are the model's, copied below
    replicas.push_back(make_model(model.config(), unused));
    replicas.back()->train(true);
  }
  const std::vector<Tensor> params = model.parameters();
  for (int64_t r = 0; r < count; ++r) {
    const std::vector<Tensor> copies = replicas[size_t(r)]->parameters();
    check(copies.size() == params.size(), "train: a replica of ", model.config().arch, " has ", copies.size(),
          " parameters, the model ", params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor copy = copies[i];  // a handle on the replica's parameter
      copy.copy_from(params[i]);
    }
  }
}

// This rank's shards of `batch` (first … first + outcomes.size()/3 − 1 of `shards`), each
// from the step's starting running statistics, each weighted gradient and updated
// statistics handed to `sum` as they become final; per shard, its loss sum, correct count
// and rows go to `outcomes`. `threads` shards at a time: a model with running statistics
// (BatchNorm) gives every thread after the first a replica of its own, holding the model's
// parameters; without replicas its shards run in turn. Returns the buckets started before
// the last shard's backward returned.
int64_t compute_local_shards(Model& model, const Batch& batch, float label_smoothing, const Sharding& sharding,
                             int64_t first, std::vector<std::shared_ptr<Model>>* replicas, BucketedSum& sum,
                             std::vector<double>& outcomes) {
  const int64_t shards = sharding.shards, mine = int64_t(outcomes.size() / 3);
  const int64_t total_rows = static_cast<int64_t>(batch.labels.size());
  const std::vector<Tensor> params = model.parameters();
  const std::vector<Tensor> buffers = buffers_of(model);
  const int64_t statistics_index = int64_t(params.size());  // buffer b is tensor statistics_index + b
  std::vector<float> start_statistics(size_t(total_numel(buffers)));
  flatten_into(buffers, start_statistics.data());
  const int64_t threads = std::min(sharding.threads, mine);
  const bool own_statistics = !buffers.empty() && threads > 1 && replicas != nullptr;
  if (own_statistics) refresh_replicas(model, threads - 1, *replicas);
  int64_t started_during_backward = 0;
  run_in_blocks(mine, buffers.empty() || own_statistics ? threads : 1, [&](int64_t thread, int64_t j) {
    Model& worker = own_statistics && thread > 0 ? *(*replicas)[size_t(thread - 1)] : model;
    std::vector<Tensor> worker_buffers = &worker == &model ? buffers : buffers_of(worker);
    const std::vector<Tensor> worker_params = &worker == &model ? params : worker.parameters();
    const BatchPart part = part_of(batch, first + j, shards);
    if (!buffers.empty()) unflatten_into(start_statistics.data(), worker_buffers);
    GradientOnly training_graph;
    Tensor logits = as_rows(worker.forward(part.inputs));
    Tensor loss = cross_entropy(logits, part.labels, label_smoothing);
    const float value = loss.item();
    const int64_t part_rows = logits.size(0);
    if (std::isfinite(value)) {  // else every rank refuses the step, once it has seen every shard's loss
      // Each parameter's gradient goes to its bucket as soon as backward has finished it.
      grad(loss, worker_params, [&](size_t i, const Tensor& g) { sum.add(j, int64_t(i), g); },
           Tensor::full(loss.shape(), float(double(part_rows) / double(total_rows))), {}, /*keep_graph=*/false);
      if (j == mine - 1) started_during_backward = sum.started_early();
    }
    NoGrad off;
    for (size_t b = 0; b < worker_buffers.size(); ++b) sum.add(j, statistics_index + int64_t(b), worker_buffers[b]);
    outcomes[size_t(j * 3)] = double(value) * double(part_rows);
    outcomes[size_t(j * 3 + 1)] = double(count_correct(logits, part.labels));
    outcomes[size_t(j * 3 + 2)] = double(part_rows);
  });
  return started_during_backward;
}

// Every shard's outcome (this rank's in `outcomes`), gathered and added in shard order;
// throws naming the shard and `step` (on every rank alike) when a loss is not finite.
StepOutcome total_over_shards(const std::vector<double>& outcomes, int64_t shards, int64_t step) {
  std::vector<double> all_outcomes(size_t(shards * 3));
  distributed::allgather(outcomes.data(), int64_t(outcomes.size()), all_outcomes.data());
  StepOutcome total;
  for (int64_t s = 0; s < shards; ++s) {
    const double loss_sum = all_outcomes[size_t(s * 3)];
    check(std::isfinite(loss_sum), "train: diverged: the training loss became ", csv_number(loss_sum),
          " in shard ", s, " at step ", step, "; lower --lr or check the data");
    total += StepOutcome{loss_sum, int64_t(all_outcomes[size_t(s * 3 + 1)]), int64_t(all_outcomes[size_t(s * 3 + 2)])};
  }
  return total;
}

// The summed gradients into the parameters' .grad, and the running statistics set to the
// mean of the shards' updated values (each shard's update of the step's starting statistics
// with its own batch statistics).
void install_sums(const std::vector<float>& summed, Model& model, int64_t shards) {
  NoGrad off;
  const float* from = summed.data();
  for (Tensor param : model.parameters()) {  // handles on the parameters
    param.set_grad(Tensor::from_vector(param.shape(), std::vector<float>(from, from + param.numel())));
    from += param.numel();
  }
  std::vector<float> statistics(from, summed.data() + summed.size());
  for (float& v : statistics) v /= float(shards);
  std::vector<Tensor> buffers = buffers_of(model);
  unflatten_into(statistics.data(), buffers);
}

// The batch in `sharding.shards` shards, this rank's computed here; their gradients and
// running statistics summed over every rank by the fixed tree (BucketedSum).
StepOutcome sharded_step(Model& model, const Batch& batch, float label_smoothing, const Sharding& sharding,
                         int64_t step, std::vector<std::shared_ptr<Model>>* replicas, GradientBuckets* buckets) {
  const int64_t shards = sharding.shards, ranks = distributed::size();
  check(shards % ranks == 0, "train: ", shards, " shards over ", ranks, " ranks");
  check(batch.size() >= shards, "train: a batch of ", batch.size(), " examples cannot make ", shards,
        " shards; give --batch at least --shards");
  // Summed over the shards: each parameter's weighted gradient, then the running
  // statistics (BatchNorm; none for most models).
  std::vector<int64_t> sizes;
  for (const Tensor& t : model.parameters()) sizes.push_back(t.numel());
  const size_t parameters = sizes.size();
  for (const Tensor& t : buffers_of(model)) sizes.push_back(t.numel());
  std::vector<int64_t> expected_order = buckets != nullptr ? buckets->order : std::vector<int64_t>{};
  if (expected_order.size() != sizes.size())
    expected_order = default_summation_order(parameters, sizes.size() - parameters);
  const ShardBlock mine = local_shards(sharding);
  distributed::stall_if_asked(step);
  BucketedSum sum(sizes, expected_order, mine.count, sharding.bucket_mib);
  std::vector<double> outcomes(size_t(mine.count * 3));  // per shard: loss sum, correct, rows
  const int64_t started_during_backward =
      compute_local_shards(model, batch, label_smoothing, sharding, mine.first, replicas, sum, outcomes);
  // Every exchange of the step polls against the deadline: the buckets, the bucket order
  // (broadcast once) and the outcomes.
  return naming_missing_rank(cat("its part of step ", step), [&] {
    // Every rank finishes every bucket before the next collective (a diverged shard's
    // buckets are sent at the end, before the loss check that stops every rank).
    const std::vector<float> summed = sum.finish();
    if (buckets != nullptr) {
      // Learnt once (a condition every rank shares: the broadcast is a collective).
      if (buckets->order.size() != sizes.size()) {
        distributed::stall_if_asked(step, "bucket-order");
        buckets->order = rank_zeros_order(sum.ready_order());
      }
      buckets->buckets = sum.buckets();
      buckets->started_during_backward = started_during_backward;
      buckets->counts = sum.counts();
    }
    StepOutcome total = total_over_shards(outcomes, shards, step);
    install_sums(summed, model, shards);
    total.exchange = sum.counts();
    return total;
  });
}

}  // namespace

StepOutcome classification_step(Model& model, const Batch& batch, float label_smoothing, const Sharding& sharding,
                                int64_t step, std::vector<std::shared_ptr<Model>>* replicas, GradientBuckets* buckets) {
  if (sharding.shards == 1 && distributed::size() == 1) return whole_batch_step(model, batch, label_smoothing, step);
  return sharded_step(model, batch, label_smoothing, sharding, step, replicas, buckets);
}

StepOutcome classification_step(Model& model, const Batch& batch, float label_smoothing, int64_t parts,
                                int64_t step) {
  parts = part_count(batch, parts);
  return classification_step(model, batch, label_smoothing, Sharding{parts, parts}, step);
}

TrainingStep classification_step(const TrainOptions& o) {
  const float label_smoothing = float(o.label_smoothing);
  const Sharding sharding = sharding_of(o);
  return {"classification",
          {{"train.adversarial", "none"}, {"train.shards", std::to_string(sharding.shards)}},
          [=, replicas = std::make_shared<std::vector<std::shared_ptr<Model>>>(),
           buckets = std::make_shared<GradientBuckets>()](Model& model, const Batch& batch, int64_t step) {
            return classification_step(model, batch, label_smoothing, sharding, step, replicas.get(), buckets.get());
          },
          /*reads_own_shards_only=*/true,
          /*required_on_resume=*/{}};
}

void run_steps(Loader& loader, Optimizer& optimizer, const Schedule& schedule, int64_t first, int64_t last,
               const StepFunction& step_function,
               const std::function<void(int64_t, const Batch&, const StepOutcome&)>& after_step) {
  for (int64_t step = first; step < last; ++step) {
    optimizer.set_lr(schedule.at(step));
    const Batch batch = loader.next();
    optimizer.zero_grad();
    const StepOutcome outcome = step_function(batch, step);
    optimizer.step();
    if (after_step) after_step(step + 1, batch, outcome);
  }
}

Evaluation evaluate(const Model& model, std::shared_ptr<const Dataset> data, const Transforms& transforms,
                    int64_t batch_size, int64_t limit, int64_t parts) {
  return evaluate(model, data, transforms, batch_size, limit, Sharding{parts, parts});
}

Evaluation evaluate(const Model& model, std::shared_ptr<const Dataset> data, const Transforms& transforms,
                    int64_t batch_size, int64_t limit, const Sharding& sharding) {
  NoGrad off;
  const bool was_training = model.training();
  const_cast<Model&>(model).train(false);
  std::shared_ptr<const Dataset> subset = data;
  if (limit > 0 && limit < data->size()) {
    std::vector<int64_t> first(static_cast<size_t>(limit));
    for (int64_t i = 0; i < limit; ++i) first[size_t(i)] = i;
    subset = std::make_shared<Subset>(data, first);
  }
  const Loader loader(subset, LoaderOptions{batch_size, false, false, false, 0, transforms});
  // Rank r evaluates batches r·B/K … (r+1)·B/K − 1. Every batch has a slot of three sums
  // (loss, correct, rows) per part, zero where a smaller batch has fewer parts; gathered,
  // they are added batch by batch, part by part: the single process's order.
  const int64_t batches = loader.batches_per_epoch(), ranks = distributed::size(), rank = distributed::rank();
  const int64_t parts_per_batch = std::max<int64_t>(sharding.shards, 1);
  const int64_t slots = parts_per_batch * 3, mine = (batches + ranks - 1) / ranks;
  std::vector<double> sums(size_t(mine * slots), 0.0);
  const int64_t first = rank * batches / ranks, last = (rank + 1) * batches / ranks;
  for (int64_t b = first; b < last; ++b) {
    const Batch batch = loader.batch(0, b);
    const int64_t parts = part_count(batch, parts_per_batch);
    double* slot = sums.data() + (b - first) * slots;
    run_in_blocks(parts, sharding.threads, [&](int64_t s) {
      NoGrad off_here;  // recording is per thread
      const BatchPart part = part_of(batch, s, parts);
      Tensor logits = as_rows(model.forward(part.inputs));
      const int64_t rows = logits.size(0);
      slot[s * 3] = double(cross_entropy(logits, part.labels).item()) * double(rows);
      slot[s * 3 + 1] = double(count_correct(logits, part.labels));
      slot[s * 3 + 2] = double(rows);
    });
  }
  std::vector<double> all(size_t(ranks * mine * slots));
  distributed::allgather(sums.data(), mine * slots, all.data());
  StepOutcome total;
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t b = r * batches / ranks; b < (r + 1) * batches / ranks; ++b) {
      const double* slot = all.data() + (r * mine + b - r * batches / ranks) * slots;
      for (int64_t s = 0; s < parts_per_batch; ++s)
        if (slot[s * 3 + 2] > 0) total += StepOutcome{slot[s * 3], int64_t(slot[s * 3 + 1]), int64_t(slot[s * 3 + 2])};
    }
  const_cast<Model&>(model).train(was_training);
  Evaluation e;
  e.count = total.rows;
  e.loss = e.count ? total.loss_sum / double(e.count) : 0;
  e.accuracy = e.count ? double(total.correct) / double(e.count) : 0;
  return e;
}

std::vector<EpochRecord> train(Model& model, const DataSource& data, const TrainOptions& o,
                               const std::function<void(const Progress&)>& on_progress,
                               const std::function<void(const EpochRecord&)>& on_epoch) {
  return train(model, data, o, classification_step(o), on_progress, on_epoch);
}

std::vector<EpochRecord> train(Model& model, const DataSource& data, const TrainOptions& o,
                               const TrainingStep& training_step,
                               const std::function<void(const Progress&)>& on_progress,
                               const std::function<void(const EpochRecord&)>& on_epoch) {
  check(o.epochs > 0, "train: --epochs must be positive, got ", o.epochs);
  check(o.batch_size > 0, "train: --batch must be positive, got ", o.batch_size);
  check_options(o);
  const std::string checkpoint_path = o.out_dir.empty() ? "" : o.out_dir + "/checkpoint.safetensors";
  check_out_dir(o, checkpoint_path);
  const Sharding sharding = sharding_of(o);
  LoaderOptions loading{o.batch_size, true, true, true, o.seed, data.train_transforms(o.augment, o.random_rescale)};
  // This rank decodes the shards it computes, no others, where the step reads no others.
  loading.decode = rows_to_decode(training_step, sharding, distributed::rank(), distributed::size());
  Loader loader(data.train, loading);
  const int64_t per_epoch = loader.batches_per_epoch();
  int64_t total = o.epochs * per_epoch;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  check_data_parallel(model, sharding.shards);
  check(o.batch_size >= sharding.shards, "train: --batch ", o.batch_size, " cannot make ", sharding.shards,
        " shards; give --batch at least --shards");
  const bool writer = distributed::rank() == 0;  // rank 0 alone writes checkpoints and logs
  std::unique_ptr<Optimizer> optimizer = make_optimizer(model, o);
  const Schedule schedule = make_schedule(o, total);

  int64_t step = 0;
  std::vector<EpochRecord> records;
  // A resumed run, or a new run that starts where another left off (its weights, optimizer
  // state and step) on this run's data: a curriculum, a poisoned or a control branch.
  const std::string start = !o.resume.empty() ? o.resume : o.continue_from;
  if (!start.empty()) {
    const char* option = !o.resume.empty() ? "--resume " : "--continue-from ";
    Checkpoint ck = load_checkpoint(start);
    if (!o.resume.empty()) {
      check_resumable(ck, model, o, data, training_step);
      check_schedule_end(ck, o, total);
    } else
      check_continuable(ck, model, o);
    load_state_dict(model, ck.model, start);
    optimizer->set_state(ck.optimizer);
    step = ck.step;
    check(step < total, option, start, ": the checkpoint is at step ", step, ", this run ends at step ", total,
          "; give more --epochs (they count from the start of the first run)");
    if (!o.resume.empty() && !o.out_dir.empty()) records = read_log(o.out_dir);
    while (!records.empty() && records.back().step > step) records.pop_back();
  }
  const int64_t resumed_from = step;

  // The batches per epoch let `info` and `eval` say where in its epoch a checkpoint stands.
  std::map<std::string, std::string> meta = {{"data.mean", join(data.mean)},
                                             {"data.std", join(data.std)},
                                             {"train.batches_per_epoch", std::to_string(per_epoch)}};
  for (const auto& [key, value] : resume_keys(o, data, training_step)) meta[key] = value;
  meta["train.ranks"] = std::to_string(distributed::size());  // for the record: a resume may use others
  meta["train.total_steps"] = std::to_string(total);            // where the schedule ends
  // The output folder is made by the first write, so that a run failing at its first
  // step leaves no empty folder behind.
  // Every checkpoint holds the optimizer's state, so that a run resumes bit for bit from any
  // of them, the kept ones included.
  auto save_to = [&](const std::string& path, int64_t epochs_done) {
    meta["train.optimizer_tensors"] = std::to_string(optimizer->state().size());
    save_checkpoint(path, model, optimizer.get(), epochs_done, step, meta);
  };
  auto save = [&](int64_t epochs_done) {
    if (o.out_dir.empty() || !writer) return;
    std::filesystem::create_directories(o.out_dir);
    save_to(checkpoint_path, epochs_done);
  };

  const std::vector<int64_t> keep =
      o.keep_checkpoints.empty() ? std::vector<int64_t>{} : checkpoint_steps(o.keep_checkpoints, total);
  if (!keep.empty() && !o.out_dir.empty() && writer) std::filesystem::create_directories(o.out_dir + "/checkpoints");
  auto keep_if_due = [&](int64_t epoch) {
    if (o.out_dir.empty() || !writer || !std::binary_search(keep.begin(), keep.end(), step)) return;
    save_to(kept_checkpoint_path(o.out_dir, step), epoch);
  };

  loader.seek(step / per_epoch, step % per_epoch);
  model.train(true);
  while (step < total) {
    const int64_t epoch = step / per_epoch;
    const auto start = Clock::now();
    double loss_sum = 0;
    int64_t correct = 0, rows_seen = 0, samples = 0;
    ExchangeCounts last_exchange;
    const int64_t epoch_end = std::min(total, (epoch + 1) * per_epoch);
    run_steps(
        loader, *optimizer, schedule, step, epoch_end,
        [&](const Batch& batch, int64_t at) { return training_step.run(model, batch, at); },
        [&](int64_t done, const Batch& batch, const StepOutcome& r) {
          step = done;
          correct += r.correct;
          rows_seen += r.rows;
          samples += batch.size();
          loss_sum += r.loss_sum;
          last_exchange = r.exchange;
          if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0 && step % per_epoch != 0) save(epoch);
          keep_if_due(step % per_epoch == 0 ? epoch + 1 : epoch);
          const int64_t b = step - 1 - epoch * per_epoch;  // this batch's index in the epoch
          if (on_progress)
            on_progress(Progress{epoch + 1, o.epochs, b + 1, std::min(per_epoch, b + 1 + total - step), step, total,
                                 loss_sum / double(rows_seen), double(correct) / double(rows_seen),
                                 double(samples) / seconds_since(start), optimizer->lr(), resumed_from});
        });
    const double train_seconds = seconds_since(start);
    // The epoch's end gathers the evaluation's sums and the exchange counts, under the deadline.
    const std::string owed = cat("its part of the evaluation after step ", step);
    distributed::stall_if_asked(step, "evaluation");
    Evaluation test = naming_missing_rank(owed, [&] {
      return evaluate(model, data.test, data.eval_transforms(), o.batch_size, o.eval_limit, sharding);
    });
    model.train(true);
    EpochRecord r{epoch + 1, step, loss_sum / double(std::max<int64_t>(rows_seen, 1)),
                  double(correct) / double(std::max<int64_t>(rows_seen, 1)), test.loss, test.accuracy,
                  train_seconds, double(samples) / train_seconds, optimizer->lr(),
                  /*diverged=*/!std::isfinite(test.loss), per_epoch, distributed::size(), sharding.shards,
                  distributed::size() > 1 || sharding.shards > 1
                      ? naming_missing_rank(owed, [&] { return exchange_per_rank(last_exchange); })
                      : std::vector<ExchangeCounts>{}};
    records.push_back(r);
    // A diverged model's weights would replace the last good checkpoint: keep that one,
    // log the epoch (its loss as null / nan) and stop; more epochs cannot recover.
    if (!r.diverged) save(step % per_epoch == 0 ? epoch + 1 : epoch);
    if (!o.out_dir.empty() && writer) {
      std::filesystem::create_directories(o.out_dir);
      write_logs(o.out_dir, records);
    }
    if (on_epoch) on_epoch(r);
    if (r.diverged) break;
  }
  return records;
}

}  // namespace adjoint
