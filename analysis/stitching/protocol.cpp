#include "analysis/stitching/protocol.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "analysis/stitching/stitched_model.h"
#include "analysis/stitching/figures.h"
#include "analysis/stitching/provenance.h"
#include "engine/autograd.h"
#include "engine/distributed/ranks.h"
#include "engine/data/loader.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/table.h"

namespace adjoint {

namespace fs = std::filesystem;

namespace {

// Raw images in [0, 1] (no normalisation: each model applies its own) with their labels.
struct RawImages {
  Tensor images;
  std::vector<int64_t> labels;
};

// The first `count` examples (0: all) of a data set, in order.
RawImages load_raw(const std::shared_ptr<const Dataset>& set, int64_t count, const std::string& what) {
  check(set && set->size() > 0, "stitch: the ", what, " set is empty");
  const int64_t n = count > 0 ? std::min(count, set->size()) : set->size();
  LoaderOptions o;
  o.batch_size = 256;
  o.shuffle = false;
  o.prefetch = false;
  Loader loader(set, o);
  Shape shape = set->shape();
  shape.insert(shape.begin(), n);
  RawImages out{Tensor::empty(shape), {}};
  const int64_t per = out.images.numel() / n;
  for (int64_t b = 0; int64_t(out.labels.size()) < n; ++b) {
    const Batch batch = loader.batch(0, b);
    const int64_t take = std::min(batch.size(), n - int64_t(out.labels.size()));
    const Tensor inputs = batch.inputs.contiguous();
    std::copy(inputs.data(), inputs.data() + take * per, out.images.data() + int64_t(out.labels.size()) * per);
    out.labels.insert(out.labels.end(), batch.labels.begin(), batch.labels.begin() + take);
  }
  return out;
}

// What a protocol trains on, given the natural images and, for one front block, the IRIs.
struct SweepData {
  const RawImages& natural;     // the standard training images
  const RawImages& iri_source;  // the images the IRIs imitate
  const Tensor& iris;           // their IRIs for the current front block (undefined if none)
};

struct ProtocolRule {
  const char* name;
  const char* help;
  bool needs_source;  // reads the images the IRIs are made from
  bool needs_iris;
  StitchTrainingSet (*training_set)(const SweepData& d);
};

const ProtocolRule kProtocols[] = {
    {"standard", "real training images for both models", false, false,
     [](const SweepData& d) { return StitchTrainingSet{d.natural.images, d.natural.images, d.natural.labels}; }},
    {"control", "the natural images the IRI set is made from", true, false,
     [](const SweepData& d) { return StitchTrainingSet{d.iri_source.images, d.iri_source.images, d.iri_source.labels}; }},
    {"invariance", "A's IRIs x′ for both models, the labels of x", true, true,
     [](const SweepData& d) { return StitchTrainingSet{d.iris, d.iris, d.iri_source.labels}; }},
};

const ProtocolRule& protocol(const std::string& name) {
  for (const ProtocolRule& p : kProtocols)
    if (name == p.name) return p;
  std::string names;
  for (const ProtocolRule& p : kProtocols) names += cat(names.empty() ? "" : ", ", p.name);
  throw UsageError(cat("unknown stitching protocol '", name, "'; protocols: ", names));
}

// One column of the results tables: its CSV header and value, its Markdown header and value.
struct TableColumn {
  const char* csv;
  const char* md;
  std::string (*csv_value)(const StitchCell&);
  std::string (*md_value)(const StitchCell&);
};

std::string percent(double share, int digits) { return std::isnan(share) ? "" : fixed(100 * share, digits) + "%"; }
std::string poor_flag(const StitchCell& c) { return c.has_iris() ? (c.iri_poor ? "POOR" : "ok") : ""; }

const TableColumn kColumns[] = {
    {"front_block", "front block", [](const StitchCell& c) { return cat(c.front_block); },
     [](const StitchCell& c) { return cat(c.front_block, " ", c.front_name); }},
    {"front_block_name", nullptr, [](const StitchCell& c) { return c.front_name; }, nullptr},
    {"end_block", "end block", [](const StitchCell& c) { return cat(c.end_block); },
     [](const StitchCell& c) { return cat(c.end_block, " ", c.end_name); }},
    {"end_block_name", nullptr, [](const StitchCell& c) { return c.end_name; }, nullptr},
    {"objective", "objective", [](const StitchCell& c) { return c.objective; }, [](const StitchCell& c) { return c.objective; }},
    {"protocol", "protocol", [](const StitchCell& c) { return c.protocol; }, [](const StitchCell& c) { return c.protocol; }},
    {"train_images", "images", [](const StitchCell& c) { return cat(c.train_images); },
     [](const StitchCell& c) { return cat(c.train_images); }},
    {"steps", "steps", [](const StitchCell& c) { return cat(c.steps); }, [](const StitchCell& c) { return cat(c.steps); }},
    {"final_loss", nullptr, [](const StitchCell& c) { return measured(c.final_loss, 6); }, nullptr},
    {"stitched_accuracy", "stitched acc.", [](const StitchCell& c) { return measured(c.stitched_accuracy, 4); },
     [](const StitchCell& c) { return percent(c.stitched_accuracy, 2); }},
    {"end_accuracy", "end acc.", [](const StitchCell& c) { return measured(c.end_accuracy, 4); },
     [](const StitchCell& c) { return percent(c.end_accuracy, 2); }},
    {"relative_score", "relative", [](const StitchCell& c) { return measured(c.relative_score, 4); },
     [](const StitchCell& c) { return measured(c.relative_score, 3); }},
    {"iri_median_distance", "IRI dist. median", [](const StitchCell& c) { return measured(c.iri_median, 4); },
     [](const StitchCell& c) { return measured(c.iri_median, 4); }},
    {"iri_p90_distance", "IRI dist. p90", [](const StitchCell& c) { return measured(c.iri_p90, 4); },
     [](const StitchCell& c) { return measured(c.iri_p90, 4); }},
    {"iri_share_below_0.05", "IRIs < 0.05", [](const StitchCell& c) { return measured(c.iri_share_below, 4); },
     [](const StitchCell& c) { return percent(c.iri_share_below, 1); }},
    {"iri_poor", "IRI set", poor_flag, poor_flag},
    {"end_agrees_on_iris", "B says y(x) on IRIs", [](const StitchCell& c) { return measured(c.end_agrees_on_iris, 4); },
     [](const StitchCell& c) { return percent(c.end_agrees_on_iris, 1); }},
    {"end_agrees_with_starts_on_iris", "B says y(x₀) on IRIs",
     [](const StitchCell& c) { return measured(c.end_agrees_with_starts_on_iris, 4); },
     [](const StitchCell& c) { return percent(c.end_agrees_with_starts_on_iris, 1); }},
    {"raua", "rAuA", [](const StitchCell& c) { return measured(c.raua, 4); }, [](const StitchCell& c) { return measured(c.raua, 3); }},
};

// results.csv, results.json and results.md for the finished cells, and their layer maps.
// `test_specs` are the further test sets every cell was scored on: two columns each.
void write_tables(const std::string& dir, const Endpoint& front, const Endpoint& end, const std::string& data_spec,
                  const std::vector<std::string>& test_specs, const std::vector<StitchCell>& cells) {
  Table csv, md;
  for (const TableColumn& column : kColumns) {
    csv.header.push_back(column.csv);
    if (column.md) md.header.push_back(column.md);
  }
  for (const std::string& spec : test_specs) {
    csv.header.insert(csv.header.end(), {cat("stitched_accuracy[", spec, "]"), cat("end_accuracy[", spec, "]")});
    md.header.insert(md.header.end(), {cat("stitched acc. on ", spec), cat("end acc. on ", spec)});
  }
  Json rows = Json::array();
  for (const StitchCell& c : cells) {
    std::vector<std::string> line, md_line;
    for (const TableColumn& column : kColumns) {
      line.push_back(column.csv_value(c));
      if (column.md) md_line.push_back(column.md_value(c));
    }
    for (const TestSetScore& t : c.test_sets) {
      line.insert(line.end(), {measured(t.stitched_accuracy, 4), measured(t.end_accuracy, 4)});
      md_line.insert(md_line.end(), {percent(t.stitched_accuracy, 2), percent(t.end_accuracy, 2)});
    }
    csv.add_row(line);
    md.add_row(md_line);
    rows.push_back(cell_to_json(c));
  }
  Json all = Json::object();
  all["front"] = front.name;
  all["end"] = end.name;
  all["data"] = data_spec;
  all["cells"] = rows;
  // All three written in full before any is renamed into place, so that an interrupted
  // sweep leaves the three tables of one moment (or the previous three), each whole.
  fs::create_directories(dir);
  AtomicFile csv_file(dir + "/results.csv", "stitch"), md_file(dir + "/results.md", "stitch"),
      json_file(dir + "/results.json", "stitch");
  csv_file.write(csv.csv());
  md_file.write(cat("# Stitching ", front.name, " into ", end.name, " on ", data_spec,
                    "\n\nAccuracies on the test set of ", data_spec, "; relative score = stitched / end (higher: more similar). "
                    "Invariance rows: the IRI set's relative distances (POOR: median not below 0.05) and the share of "
                    "the front model's IRIs x′ the end model labels y(x) (the image imitated) and y(x₀) (the start).\n\n",
                    md.markdown()));
  json_file.write(to_json(all, 2) + "\n");
  csv_file.commit();
  md_file.commit();
  json_file.commit();
  write_layer_maps(dir, cat(front.name, " -> ", end.name, " on ", data_spec), cells);
}

using Log = std::function<void(const std::string&)>;

bool all_finite(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::all_of(c.data(), c.data() + c.numel(), [](float v) { return std::isfinite(v); });
}

// A further test set: its first images and the end model's accuracy on them.
struct ExtraTestSet {
  std::string spec;
  RawImages test;
  double end_accuracy = 0;
};

// A further test set (--test-data): open_data's errors name the option they came from.
DataSource open_test_data(const std::string& spec) {
  auto renamed = [&](const std::string& message) {
    return message.rfind("--data ", 0) == 0 ? "--test-data " + message.substr(7) : cat("--test-data ", spec, ": ", message);
  };
  try {
    return open_data(spec);
  } catch (const UsageError& e) {
    throw UsageError(renamed(e.what()));
  } catch (const Error& e) {
    throw Error(renamed(e.what()));
  }
}

bool scored_on(const StitchCell& c, const std::vector<ExtraTestSet>& sets) {
  if (c.test_sets.size() != sets.size()) return false;
  for (size_t k = 0; k < sets.size(); ++k)
    if (c.test_sets[k].data != sets[k].spec) return false;
  return true;
}

// Refuses fula weights that do not match the terms from the end block to B's penultimate
// block, before any work, naming the models and blocks.
void check_fula_weights(const StitchPair& pair, const StitchSweepOptions& o) {
  const std::vector<double>& weights = o.train.objective_options.fula_weights;
  if (weights.empty() || std::find(o.objectives.begin(), o.objectives.end(), "fula") == o.objectives.end()) return;
  const Model& b = *pair.end().model;
  const size_t terms = b.num_blocks() - 1 - pair.end_block();
  check(weights.size() == terms, "stitch ", pair.shapes().where, ": fula has ", terms, " terms, from end block ",
        pair.end_block(), " to the penultimate block ", b.num_blocks() - 2, " '", b.blocks()[b.num_blocks() - 2].name,
        "', but ", weights.size(), " fula weights are given");
}

void initialise(Stitch& s, const StitchPair& pair, const StitchTrainingSet& data, const StitchSweepOptions& o) {
  if (o.init == "identity") return s.init_identity();
  if (o.init == "random") {
    Generator gen(o.train.seed);
    return s.init_random(gen);
  }
  check(o.init == "least-squares", "stitch: unknown initialisation '", o.init, "'; identity, least-squares, random");
  const int64_t n = std::min<int64_t>(o.init_images, data.front_inputs.size(0));
  NoGrad off;
  const Tensor front = pair.front_features(select_rows(data.front_inputs, 0, n));
  const Tensor end = pair.end_targets(select_rows(data.end_inputs, 0, n)).front();
  s.init_least_squares(front, end, o.ridge);
}

// Checks everything a sweep needs before any work (nothing is written when it throws) and
// returns the stitch pairs, each built and so checked.
std::vector<StitchPair> checked_pairs(const Endpoint& front, const Endpoint& end, const DataSource& data,
                                      const StitchSweepOptions& o, const Log& log) {
  check(!o.out_dir.empty(), "stitch: no output folder");
  check(!o.points.empty() && !o.objectives.empty() && !o.protocols.empty(),
        "stitch: nothing to do (no stitch points, objectives or protocols)");
  for (const std::string& name : o.objectives) objective(name);  // unknown names fail before any work
  bool any_source = false;
  for (const std::string& name : o.protocols) any_source |= protocol(name).needs_source;
  check(data.images && data.train && data.test, "stitch: ", data.spec, " is not an image data set");
  const Shape example = data.train->shape();
  std::vector<StitchPair> pairs;
  for (auto [i, j] : o.points) pairs.emplace_back(front, i, end, j, example);
  const bool fula = std::find(o.objectives.begin(), o.objectives.end(), "fula") != o.objectives.end();
  for (const StitchPair& p : pairs) {
    Stitch check_shapes(p.shapes());
    check_fula_weights(p, o);
    if (fula && p.end_block() + 2 == end.model->num_blocks() && log)
      log(cat("note: ", p.shapes().where, ": B has no block between the stitch point and its head, so fula has one "
              "term there: dm normalised by ‖B_j(x)‖²"));
  }
  if (any_source) {
    std::string blocks;
    for (const StitchPair& p : pairs)
      blocks += cat(blocks.empty() ? "" : ", ", p.front_block(), " '", front.model->blocks()[p.front_block()].name, "'");
    check(o.iri_images >= 2, "stitch: the IRI set of ", front.name, " needs at least 2 images of ", data.spec,
          ", got ", o.iri_images, " (--iri-images); it is made for front blocks ", blocks, " on images ", example);
  }
  return pairs;
}

// One run of the sweep: what it loads once (images, the end model's scores, the further
// test sets), the IRI sets it makes or reads back, and its cells.
class SweepRun {
public:
  SweepRun(const Endpoint& front, const Endpoint& end, const DataSource& data, const StitchSweepOptions& o,
           const Log& log);
  // The cell of `pair` under `protocol_name` and `objective_name`, read back or computed;
  // `index` of `total` for the progress lines.
  StitchCell cell(const StitchPair& pair, const std::string& protocol_name, const std::string& objective_name,
                  int64_t index, int64_t total);
  // The cell's file, which another rank of the job wrote (when every cell is done).
  StitchCell finished_cell(const StitchPair& pair, const std::string& protocol_name, const std::string& objective_name);
  // The IRI set of a front block: made (or read back) and drawn, once per job.
  void make_iris(size_t block) { iris(block); }
  // From now on a rank reads the IRI sets back, and draws none of them again.
  void iri_sets_made_first() { iri_sets_made_first_ = true; }

private:
  RecordSubject subject(RecordSubject::Kind kind, const StitchPair& pair, const std::string& objective_name,
                        const std::string& protocol_name) const {
    return {kind, pair.front_block(), pair.end_block(), objective_name, protocol_name};
  }
  Provenance record(const RecordSubject& s) const { return make_provenance(front_, end_, data_.spec, o_, s); }
  bool read_back(StitchCell& c, const StitchPair& pair, const std::string& cell_path, const std::string& stitch_path);
  void compute(StitchCell& c, const StitchPair& pair, const std::string& stitch_path, int64_t index, int64_t total);
  const IriSet& iris(size_t block);
  StitchCell blank_cell(const StitchPair& pair, const std::string& protocol_name, const std::string& objective_name) const;
  std::string cell_path(const StitchCell& c) const { return o_.out_dir + "/cells/" + c.key() + ".json"; }
  std::string stitch_path(const StitchCell& c) const { return o_.out_dir + "/stitches/" + c.key() + ".safetensors"; }
  IriSet read_or_find_iris(size_t block, const std::string& path);
  std::vector<TestSetScore> score_test_sets(const StitchPair& pair, const Stitch& stitch) const;
  double area_under_attack(const RawClassifier& logits) const {
    return area_under_accuracy(o_.raua_eps, robust_accuracy(logits, raua_images_, raua_labels_, o_.raua_eps, o_.raua_attack));
  }

  const Endpoint& front_;
  const Endpoint& end_;
  const DataSource& data_;
  const StitchSweepOptions& o_;
  const Log& log_;
  RawImages natural_, test_, iri_source_;
  RawClassifier end_logits_;
  double end_accuracy_ = 0;
  // rAuA: the area under a model's accuracy-versus-ε curve under PGD on the first
  // raua_images test images, the end model's computed once.
  Tensor raua_images_;
  std::vector<int64_t> raua_labels_;
  double end_area_ = NAN;
  std::vector<ExtraTestSet> extra_tests_;
  std::map<size_t, IriSet> iris_;  // per front block, made when first needed
  bool iri_sets_made_first_ = false;
  double compute_seconds_ = 0;
  int64_t computed_ = 0;
};

SweepRun::SweepRun(const Endpoint& front, const Endpoint& end, const DataSource& data, const StitchSweepOptions& o,
                   const Log& log)
    : front_(front), end_(end), data_(data), o_(o), log_(log) {
  const Shape example = data.train->shape();
  std::vector<DataSource> test_sources;
  for (const std::string& spec : o.test_data) {
    test_sources.push_back(open_test_data(spec));
    const DataSource& source = test_sources.back();
    check(source.images && source.test && source.test->shape() == example, "stitch: the test set of ", spec,
          " (--test-data) holds examples ", source.test ? source.test->shape() : Shape{}, ", but the models are stitched on ",
          data.spec, " images ", example);
  }
  // What a sweep killed mid-write (kill -9) left: temporaries, never tables or cells. Rank 0
  // alone removes them, before any rank starts writing (the barrier at the end).
  if (distributed::rank() == 0)
    for (const char* folder : {"", "/cells", "/stitches", "/iris"})
      if (fs::is_directory(o.out_dir + folder)) remove_stale_temporaries(o.out_dir + folder);
  natural_ = load_raw(data.train, o.train_images, "training");
  test_ = load_raw(data.test, o.test_images, "test");
  bool any_source = false;
  for (const std::string& name : o.protocols) any_source |= protocol(name).needs_source;
  if (any_source) iri_source_ = load_raw(data.train, o.iri_images, "training");
  end_logits_ = [&end](const Tensor& raw) { return end.model->forward(end.input(raw)); };
  end_accuracy_ = accuracy(end_logits_, test_.images, test_.labels);
  if (log_) log_(cat("end model ", end.name, ": test accuracy ", fixed(100 * end_accuracy_, 2), "% on ", test_.labels.size(), " images"));
  if (!o.raua_eps.empty()) {
    const int64_t count = std::min<int64_t>(o.raua_images, int64_t(test_.labels.size()));
    raua_images_ = select_rows(test_.images, 0, count);
    raua_labels_.assign(test_.labels.begin(), test_.labels.begin() + count);
    end_area_ = area_under_attack(end_logits_);
    if (log_) log_(cat("end model ", end.name, ": AuA ", fixed(end_area_, 5), " under PGD ", o.raua_attack.norm, " on ", count, " images"));
  }
  for (const DataSource& source : test_sources) {
    ExtraTestSet t{source.spec, load_raw(source.test, o.test_images, "test"), 0};
    t.end_accuracy = accuracy(end_logits_, t.test.images, t.test.labels);
    if (log_) log_(cat("end model ", end.name, ": accuracy ", fixed(100 * t.end_accuracy, 2), "% on ", t.test.labels.size(),
                       " test images of ", t.spec));
    extra_tests_.push_back(std::move(t));
  }
  distributed::barrier();
}

std::vector<TestSetScore> SweepRun::score_test_sets(const StitchPair& pair, const Stitch& stitch) const {
  std::vector<TestSetScore> scores;
  for (const ExtraTestSet& t : extra_tests_)
    scores.push_back({t.spec,
                      accuracy([&](const Tensor& raw) { return pair.stitched_logits(stitch, raw); }, t.test.images,
                               t.test.labels),
                      t.end_accuracy});
  return scores;
}

// The IRI set of the front model's block, read back from `path` when this run's settings
// made it before.
IriSet SweepRun::read_or_find_iris(size_t block, const std::string& path) {
  const Provenance wanted = record({RecordSubject::iri_set, block, 0, "", ""});
  if (fs::exists(path)) {
    IriFile f = read_iri_file(path);
    if (may_reuse("stitch", path, f.made, wanted, o_.overwrite, log_)) {
      check(f.inputs.shape() == iri_source_.images.shape(), "stitch: IRI file ", path, " holds IRIs ", f.inputs.shape(),
            " but the sweep asks for ", iri_source_.images.shape(), "; remove it or use another --out");
      IriSet set{f.inputs, f.starts, f.start_index, f.distance, iri_quality(f.distance)};
      if (log_) log_(cat("IRIs of ", front_.name, " block ", block, ": read ", path, "; ", set.quality.summary()));
      return set;
    }
  }
  auto start = std::chrono::steady_clock::now();
  IriSet set = find_iris(front_, block, iri_source_.images, o_.iri, [&](int64_t done, int64_t total) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (log_)
      log_(cat("IRIs of ", front_.name, " block ", block, ": ", done, "/", total, " images, ", fixed(seconds, 1),
               "s, ETA ", fixed(seconds * double(total - done) / double(done), 0), "s"));
  });
  fs::create_directories(fs::path(path).parent_path());
  write_iri_file(path, {set.inputs, set.starts, set.start_index, set.distance, wanted},
                 {{"front", front_.name}, {"block", std::to_string(block)}, {"quality", set.quality.summary()}});
  if (log_) log_(cat("IRIs of ", front_.name, " block ", block, ": ", set.quality.summary()));
  return set;
}

// The IRI set of the front model's block (iris/front_block_<i>.safetensors) and its picture
// beside the images it imitates and its starts (iris/front_block_<i>.png).
const IriSet& SweepRun::iris(size_t block) {
  if (iris_.count(block)) return iris_.at(block);
  const std::string stem = cat(o_.out_dir, "/iris/front_block_", block);
  const IriSet& set = iris_.emplace(block, read_or_find_iris(block, stem + ".safetensors")).first->second;
  if (iri_sets_made_first_) return set;  // drawn (and judged) by the rank that made it
  write_iri_grid(stem + ".png", cat("IRIs of ", front_.name, " block ", block, " '", front_.model->blocks()[block].name, "': ",
                                    set.quality.summary()),
                 iri_source_.images, set.starts, set.inputs, set.distance);
  if (set.quality.poor() && log_)
    log_(cat("WARNING: the IRI set of ", front_.name, " block ", block, " is POOR (", set.quality.summary(),
             "): the front model tells x′ from x, so invariance-aware scores for this block are not "
             "meaningful; use more --iri-steps or --iri-rule adam"));
  return set;
}

// A finished cell from its file when this run's settings made it; false when there is
// none or --overwrite remakes it. Scores it on further test sets it lacks, from its stitch.
bool SweepRun::read_back(StitchCell& c, const StitchPair& pair, const std::string& cell_path,
                         const std::string& stitch_path) {
  if (!fs::exists(cell_path)) return false;
  StitchCell done = read_cell_text(read_text_file(cell_path), cell_path);
  if (!may_reuse("stitch", cell_path, done.made, c.made, o_.overwrite, log_)) return false;
  if (!scored_on(done, extra_tests_)) {  // asked for other test sets than when it ran
    const StitchFile file = read_stitch_parameters(stitch_path);
    const Provenance wanted = record(subject(RecordSubject::stitch, pair, c.objective, c.protocol));
    if (!may_reuse("stitch", stitch_path, file.made, wanted, o_.overwrite, log_)) return false;
    done.test_sets = score_test_sets(pair, *load_stitch(pair, file));
    write_file_atomic(cell_path, to_json(cell_to_json(done), 2) + "\n");
  }
  c = done;
  return true;
}

// Trains, scores and writes one cell (its stitch file, its cell file, the tables).
void SweepRun::compute(StitchCell& c, const StitchPair& pair, const std::string& stitch_path, int64_t index,
                       int64_t total) {
  const ProtocolRule& rule = protocol(c.protocol);
  const IriSet* set = rule.needs_iris ? &iris(pair.front_block()) : nullptr;
  const Tensor no_iris;
  const StitchTrainingSet training = rule.training_set({natural_, iri_source_, set ? set->inputs : no_iris});
  Stitch stitch(pair.shapes());
  initialise(stitch, pair, training, o_);
  StitchTrainOptions train = o_.train;
  train.objective = c.objective;
  // A progress line at most every 10 seconds of a long cell.
  auto last_line = std::chrono::steady_clock::now();
  const StitchTrainResult r = train_stitch(stitch, pair, training, train, [&](int64_t step, int64_t steps, double loss) {
    const auto now = std::chrono::steady_clock::now();
    if (!log_ || std::chrono::duration<double>(now - last_line).count() < 10.0) return;
    last_line = now;
    log_(cat("[", index, "/", total, "] ", c.key(), ": step ", step, "/", steps, ", loss ", fixed(loss, 4)));
  });
  check(all_finite(stitch.weight) && all_finite(stitch.bias), "stitch ", pair.shapes().where, ", ", c.objective, " ",
        c.protocol, ": training diverged (non-finite weights after ", r.steps, " steps at lr ", o_.train.lr,
        "); use a smaller --lr");
  c.train_images = training.front_inputs.size(0);
  c.steps = r.steps;
  c.final_loss = r.final_loss;
  const RawClassifier stitched = [&](const Tensor& raw) { return pair.stitched_logits(stitch, raw); };
  c.stitched_accuracy = accuracy(stitched, test_.images, test_.labels);
  c.end_accuracy = end_accuracy_;
  c.relative_score = end_accuracy_ > 0 ? c.stitched_accuracy / end_accuracy_ : NAN;
  if (!o_.raua_eps.empty()) c.raua = area_under_attack(stitched) / end_area_;
  if (set) {
    c.iri_median = set->quality.median;
    c.iri_p90 = set->quality.p90;
    c.iri_share_below = set->quality.share_below;
    c.iri_poor = set->quality.poor();
    // How B labels the IRIs: as the image they imitate, and as the image they start from.
    c.end_agrees_on_iris = accuracy(end_logits_, set->inputs, iri_source_.labels);
    std::vector<int64_t> start_labels;
    for (int64_t from : set->start_index)
      if (from >= 0) start_labels.push_back(iri_source_.labels[size_t(from)]);
    if (start_labels.size() == iri_source_.labels.size())
      c.end_agrees_with_starts_on_iris = accuracy(end_logits_, set->inputs, start_labels);
  }
  c.test_sets = score_test_sets(pair, stitch);
  fs::create_directories(fs::path(stitch_path).parent_path());
  write_stitch_file(stitch_path, pair, stitch, record(subject(RecordSubject::stitch, pair, c.objective, c.protocol)));
}

StitchCell SweepRun::blank_cell(const StitchPair& pair, const std::string& protocol_name,
                                const std::string& objective_name) const {
  StitchCell c;
  c.front_block = pair.front_block();
  c.end_block = pair.end_block();
  c.front_name = front_.model->blocks()[c.front_block].name;
  c.end_name = end_.model->blocks()[c.end_block].name;
  c.objective = objective_name;
  c.protocol = protocol_name;
  c.made = record(subject(RecordSubject::cell, pair, objective_name, protocol_name));
  return c;
}

StitchCell SweepRun::finished_cell(const StitchPair& pair, const std::string& protocol_name,
                                   const std::string& objective_name) {
  StitchCell c = blank_cell(pair, protocol_name, objective_name);
  check(read_back(c, pair, cell_path(c), stitch_path(c)), "stitch: ", cell_path(c),
        " is missing after every rank finished its cells");
  return c;
}

StitchCell SweepRun::cell(const StitchPair& pair, const std::string& protocol_name, const std::string& objective_name,
                          int64_t index, int64_t total) {
  StitchCell c = blank_cell(pair, protocol_name, objective_name);
  const std::string cell_path = this->cell_path(c), stitch_path = this->stitch_path(c);
  if (read_back(c, pair, cell_path, stitch_path)) {
    if (log_) log_(cat("[", index, "/", total, "] ", c.key(), ": done before, read ", cell_path));
    return c;
  }
  const auto started = std::chrono::steady_clock::now();
  compute(c, pair, stitch_path, index, total);
  fs::create_directories(fs::path(cell_path).parent_path());
  write_file_atomic(cell_path, to_json(cell_to_json(c), 2) + "\n");
  compute_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ++computed_;
  if (log_)
    log_(cat("[", index, "/", total, "] ", c.key(), ": stitched ", fixed(100 * c.stitched_accuracy, 2), "%, end ",
             fixed(100 * end_accuracy_, 2), "%, relative ", fixed(c.relative_score, 3), "; ETA ",
             fixed(compute_seconds_ / double(computed_) * double(total - index), 0), "s"));
  return c;
}

}  // namespace

std::vector<StitchCell> run_stitch_sweep(const Endpoint& front, const Endpoint& end, const DataSource& data,
                                         const StitchSweepOptions& o, const Log& log) {
  const std::vector<StitchPair> pairs = checked_pairs(front, end, data, o, log);
  // Under mpirun every line names its rank.
  const int ranks = distributed::size(), rank = distributed::rank();
  const Log ranked_log = ranks == 1 || !log ? log : Log([&](const std::string& line) { log(cat(line, " (rank ", rank, ")")); });
  SweepRun run(front, end, data, o, ranked_log);
  // The cells in table order: (stitch point, protocol, objective).
  struct CellKey {
    const StitchPair& pair;
    const std::string& protocol;
    const std::string& objective;
  };
  std::vector<CellKey> keys;
  for (const StitchPair& pair : pairs)
    for (const std::string& protocol_name : o.protocols)
      for (const std::string& objective_name : o.objectives) keys.push_back({pair, protocol_name, objective_name});
  const int64_t total = int64_t(keys.size());
  std::vector<StitchCell> cells;
  if (ranks == 1) {  // the tables rewritten after every cell
    for (const CellKey& k : keys) {
      cells.push_back(run.cell(k.pair, k.protocol, k.objective, int64_t(cells.size()) + 1, total));
      write_tables(o.out_dir, front, end, data.spec, o.test_data, cells);
    }
    return cells;
  }
  // Over ranks: first the IRI sets, one rank each (several cells read each one), then the
  // cells, handed out by rank 0 as ranks become free; each rank writes the cells it makes.
  // When all are done, rank 0 reads them back and writes the tables once: a cell's numbers
  // do not depend on the rank that made it, so they are the single process's tables.
  std::vector<size_t> iri_blocks;
  for (const std::string& name : o.protocols)
    if (protocol(name).needs_iris)
      for (const StitchPair& pair : pairs)
        if (std::find(iri_blocks.begin(), iri_blocks.end(), pair.front_block()) == iri_blocks.end())
          iri_blocks.push_back(pair.front_block());
  distributed::for_each_item(int64_t(iri_blocks.size()), [&](int64_t k) { run.make_iris(iri_blocks[size_t(k)]); });
  run.iri_sets_made_first();
  distributed::for_each_item(total, [&](int64_t i) {
    const CellKey& k = keys[size_t(i)];
    run.cell(k.pair, k.protocol, k.objective, i + 1, total);
  });
  if (rank != 0) return cells;  // rank 0 alone returns the cells, and writes the tables
  for (const CellKey& k : keys) cells.push_back(run.finished_cell(k.pair, k.protocol, k.objective));
  write_tables(o.out_dir, front, end, data.spec, o.test_data, cells);
  return cells;
}

}  // namespace adjoint
