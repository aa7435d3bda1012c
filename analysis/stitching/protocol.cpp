#include "analysis/stitching/protocol.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "analysis/stitching/stitched_model.h"
#include "analysis/stitching/figures.h"
#include "engine/autograd.h"
#include "engine/data/loader.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"

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

Json cell_to_json(const StitchCell& c) {
  auto number = [](double v) { return std::isfinite(v) ? Json(v) : Json(); };
  Json j = Json::object();
  j["front_block"] = int64_t(c.front_block);
  j["front_block_name"] = c.front_name;
  j["end_block"] = int64_t(c.end_block);
  j["end_block_name"] = c.end_name;
  j["objective"] = c.objective;
  j["protocol"] = c.protocol;
  j["train_images"] = c.train_images;
  j["final_loss"] = number(c.final_loss);
  j["stitched_accuracy"] = c.stitched_accuracy;
  j["end_accuracy"] = c.end_accuracy;
  j["relative_score"] = number(c.relative_score);
  j["end_agrees_on_iris"] = number(c.end_agrees_on_iris);
  j["iri_median_distance"] = number(c.iri_median);
  j["raua"] = number(c.raua);
  Json tests = Json::array();
  for (const TestSetScore& t : c.test_sets) {
    Json one = Json::object();
    one["data"] = t.data;
    one["stitched_accuracy"] = t.stitched_accuracy;
    one["end_accuracy"] = t.end_accuracy;
    tests.push_back(one);
  }
  j["test_sets"] = tests;
  return j;
}

StitchCell cell_from_json(const Json& j) {
  auto number = [&](const char* key) {
    const Json* v = j.find(key);
    return v && v->is_number() ? v->as_number() : NAN;
  };
  StitchCell c;
  c.front_block = size_t(j.find("front_block")->as_int());
  c.end_block = size_t(j.find("end_block")->as_int());
  c.front_name = j.find("front_block_name")->as_string();
  c.end_name = j.find("end_block_name")->as_string();
  c.objective = j.find("objective")->as_string();
  c.protocol = j.find("protocol")->as_string();
  c.train_images = j.find("train_images")->as_int();
  c.final_loss = number("final_loss");
  c.stitched_accuracy = number("stitched_accuracy");
  c.end_accuracy = number("end_accuracy");
  c.relative_score = number("relative_score");
  c.end_agrees_on_iris = number("end_agrees_on_iris");
  c.iri_median = number("iri_median_distance");
  c.raua = number("raua");
  if (const Json* tests = j.find("test_sets"))
    for (const Json& t : tests->as_array())
      c.test_sets.push_back({t.find("data")->as_string(), t.find("stitched_accuracy")->as_number(),
                             t.find("end_accuracy")->as_number()});
  return c;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

// results.csv, results.json and results.md for the finished cells, and their layer maps.
// `test_specs` are the further test sets every cell was scored on: two columns each.
void write_tables(const std::string& dir, const Endpoint& front, const Endpoint& end, const std::string& data_spec,
                  const std::vector<std::string>& test_specs, const std::vector<StitchCell>& cells) {
  std::string csv =
      "front_block,front_block_name,end_block,end_block_name,objective,protocol,train_images,final_loss,"
      "stitched_accuracy,end_accuracy,relative_score,end_agrees_on_iris,iri_median_distance,raua";
  std::string md_head = "| front block | end block | objective | protocol | stitched acc. | end acc. | relative | "
                        "B on IRIs | IRI median dist. | rAuA |";
  std::string md_rule = "|---|---|---|---|---|---|---|---|---|---|";
  for (const std::string& spec : test_specs) {
    csv += cat(",stitched_accuracy[", spec, "],end_accuracy[", spec, "]");
    md_head += cat(" stitched acc. on ", spec, " | end acc. on ", spec, " |");
    md_rule += "---|---|";
  }
  csv += "\n";
  std::string md = cat("# Stitching ", front.name, " into ", end.name, " on ", data_spec,
                       "\n\nAccuracies on the test set of ", data_spec, "; relative score = stitched / end (higher: more similar). "
                       "\"B on IRIs\": the end model's agreement with y(x) on the front model's IRIs x′.\n\n",
                       md_head, "\n", md_rule, "\n");
  Json rows = Json::array();
  for (const StitchCell& c : cells) {
    csv += cat(c.front_block, ",", c.front_name, ",", c.end_block, ",", c.end_name, ",", c.objective, ",", c.protocol,
               ",", c.train_images, ",", fixed(c.final_loss, 6), ",", fixed(c.stitched_accuracy, 4), ",",
               fixed(c.end_accuracy, 4), ",", fixed(c.relative_score, 4), ",", fixed(c.end_agrees_on_iris, 4), ",",
               fixed(c.iri_median, 4), ",", fixed(c.raua, 4));
    md += cat("| ", c.front_block, " ", c.front_name, " | ", c.end_block, " ", c.end_name, " | ", c.objective, " | ",
              c.protocol, " | ", fixed(100 * c.stitched_accuracy, 2), "% | ", fixed(100 * c.end_accuracy, 2), "% | ",
              fixed(c.relative_score, 3), " | ", fixed(100 * c.end_agrees_on_iris, 1),
              std::isfinite(c.end_agrees_on_iris) ? "%" : "", " | ", fixed(c.iri_median, 4), " | ", fixed(c.raua, 3), " |");
    for (const TestSetScore& t : c.test_sets) {
      csv += cat(",", fixed(t.stitched_accuracy, 4), ",", fixed(t.end_accuracy, 4));
      md += cat(" ", fixed(100 * t.stitched_accuracy, 2), "% | ", fixed(100 * t.end_accuracy, 2), "% |");
    }
    csv += "\n";
    md += "\n";
    rows.push_back(cell_to_json(c));
  }
  Json all = Json::object();
  all["front"] = front.name;
  all["end"] = end.name;
  all["data"] = data_spec;
  all["cells"] = rows;
  // All three written in full before any is renamed into place, so that an interrupted
  // sweep leaves the three tables of one moment (or the previous three), each whole.
  AtomicFile csv_file(dir + "/results.csv", "stitch"), md_file(dir + "/results.md", "stitch"),
      json_file(dir + "/results.json", "stitch");
  csv_file.write(csv);
  md_file.write(md);
  json_file.write(to_json(all, 2) + "\n");
  csv_file.commit();
  md_file.commit();
  json_file.commit();
  write_layer_maps(dir, cat(front.name, " -> ", end.name, " on ", data_spec), cells);
}

// The IRI set of the front model's block, read back from `path` when a run made it before.
IriSet read_or_find_iris(const Endpoint& front, size_t block, const RawImages& source, const IriOptions& o,
                         const std::string& path, const std::function<void(const std::string&)>& log) {
  if (fs::exists(path)) {
    const SafetensorsFile f = read_safetensors(path);
    IriSet set{f.tensors.at("inputs"), f.tensors.at("starts"), {}, {}};
    check(set.inputs.shape() == source.images.shape(), "stitch: ", path, " holds IRIs ", set.inputs.shape(),
          " but the sweep asks for ", source.images.shape(), "; remove it or use another --out");
    for (float d : f.tensors.at("distance").to_vector()) set.distance.push_back(d);
    set.quality = iri_quality(set.distance);
    if (log) log(cat("IRIs of ", front.name, " block ", block, ": read ", path, "; ", set.quality.summary()));
    return set;
  }
  auto start = std::chrono::steady_clock::now();
  IriSet set = find_iris(front, block, source.images, o, [&](int64_t done, int64_t total) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (log)
      log(cat("IRIs of ", front.name, " block ", block, ": ", done, "/", total, " images, ", fixed(seconds, 1),
              "s, ETA ", fixed(seconds * double(total - done) / double(done), 0), "s"));
  });
  std::vector<float> distance(set.distance.begin(), set.distance.end());
  write_safetensors(path,
                    {{"inputs", set.inputs},
                     {"starts", set.starts},
                     {"distance", Tensor::from_vector({int64_t(distance.size())}, distance)}},
                    {{"front", front.name}, {"block", std::to_string(block)}, {"quality", set.quality.summary()}});
  if (log) log(cat("IRIs of ", front.name, " block ", block, ": ", set.quality.summary()));
  return set;
}

// The IRI set of the front model's block (iris/front_block_<i>.safetensors) and its picture
// beside the images it imitates and its starts (iris/front_block_<i>.png).
IriSet iris_for_block(const Endpoint& front, size_t block, const RawImages& source, const IriOptions& o,
                      const std::string& dir, const std::function<void(const std::string&)>& log) {
  const std::string stem = cat(dir, "/iris/front_block_", block);
  IriSet set = read_or_find_iris(front, block, source, o, stem + ".safetensors", log);
  write_iri_grid(stem + ".png", cat("IRIs of ", front.name, " block ", block, " '", front.model->blocks()[block].name, "': ",
                                    set.quality.summary()),
                 source.images, set.starts, set.inputs, set.distance);
  return set;
}

// A further test set: its first images and the end model's accuracy on them.
struct ExtraTestSet {
  std::string spec;
  RawImages test;
  double end_accuracy = 0;
};

std::vector<TestSetScore> score_test_sets(const std::vector<ExtraTestSet>& sets, const StitchPair& pair,
                                          const Stitch& stitch) {
  std::vector<TestSetScore> scores;
  for (const ExtraTestSet& t : sets)
    scores.push_back({t.spec,
                      accuracy([&](const Tensor& raw) { return pair.stitched_logits(stitch, raw); }, t.test.images,
                               t.test.labels),
                      t.end_accuracy});
  return scores;
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

}  // namespace

std::string StitchCell::key() const { return cat("front", front_block, "_end", end_block, "_", objective, "_", protocol); }

std::vector<std::string> stitch_protocol_names() {
  std::vector<std::string> names;
  for (const ProtocolRule& p : kProtocols) names.push_back(p.name);
  return names;
}

std::vector<StitchCell> run_stitch_sweep(const Endpoint& front, const Endpoint& end, const DataSource& data,
                                         const StitchSweepOptions& o, const std::function<void(const std::string&)>& log) {
  check(!o.out_dir.empty(), "stitch: no output folder");
  check(!o.points.empty() && !o.objectives.empty() && !o.protocols.empty(),
        "stitch: nothing to do (no stitch points, objectives or protocols)");
  for (const std::string& name : o.objectives) objective(name);  // unknown names fail before any work
  bool any_source = false, any_iris = false;
  for (const std::string& name : o.protocols) {
    any_source |= protocol(name).needs_source;
    any_iris |= protocol(name).needs_iris;
  }
  check(data.images && data.train && data.test, "stitch: ", data.spec, " is not an image data set");
  const Shape example = data.train->shape();
  // Every pair is built (and so checked) before any training starts.
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
  std::vector<DataSource> test_sources;
  for (const std::string& spec : o.test_data) {
    test_sources.push_back(open_data(spec));
    const DataSource& source = test_sources.back();
    check(source.images && source.test && source.test->shape() == example, "stitch: the test set of ", spec,
          " holds examples ", source.test ? source.test->shape() : Shape{}, ", but the models are stitched on ",
          data.spec, " images ", example);
  }

  fs::create_directories(o.out_dir + "/cells");
  fs::create_directories(o.out_dir + "/stitches");
  // What a sweep killed mid-write (kill -9) left: temporaries, never tables or cells.
  for (const char* folder : {"", "/cells", "/stitches", "/iris"})
    if (fs::is_directory(o.out_dir + folder)) remove_stale_temporaries(o.out_dir + folder);
  const RawImages natural = load_raw(data.train, o.train_images, "training");
  const RawImages test = load_raw(data.test, o.test_images, "test");
  RawImages iri_source;
  if (any_source) {
    iri_source = load_raw(data.train, o.iri_images, "training");
    fs::create_directories(o.out_dir + "/iris");
  }
  const auto end_logits = [&](const Tensor& raw) { return end.model->forward(end.input(raw)); };
  const double end_accuracy = accuracy(end_logits, test.images, test.labels);
  if (log) log(cat("end model ", end.name, ": test accuracy ", fixed(100 * end_accuracy, 2), "% on ", test.labels.size(), " images"));
  // rAuA: the area under a model's accuracy-versus-ε curve under PGD on the first
  // raua_images test images, the end model's computed once.
  const bool raua = !o.raua_eps.empty();
  const int64_t raua_count = raua ? std::min<int64_t>(o.raua_images, int64_t(test.labels.size())) : 0;
  const Tensor raua_images = raua ? select_rows(test.images, 0, raua_count) : Tensor();
  const std::vector<int64_t> raua_labels(test.labels.begin(), test.labels.begin() + raua_count);
  auto area_under_attack = [&](const RawClassifier& logits) {
    return area_under_accuracy(o.raua_eps, robust_accuracy(logits, raua_images, raua_labels, o.raua_eps, o.raua_attack));
  };
  const double end_area = raua ? area_under_attack([&](const Tensor& raw) { return end.model->forward(end.input(raw)); }) : NAN;
  if (raua && log) log(cat("end model ", end.name, ": AuA ", fixed(end_area, 5), " under PGD ", o.raua_attack.norm, " on ", raua_count, " images"));
  std::vector<ExtraTestSet> extra_tests;
  for (const DataSource& source : test_sources) {
    ExtraTestSet t{source.spec, load_raw(source.test, o.test_images, "test"), 0};
    t.end_accuracy = accuracy(end_logits, t.test.images, t.test.labels);
    if (log) log(cat("end model ", end.name, ": accuracy ", fixed(100 * t.end_accuracy, 2), "% on ", t.test.labels.size(),
                     " test images of ", t.spec));
    extra_tests.push_back(std::move(t));
  }

  std::vector<StitchCell> cells;
  const int64_t total = int64_t(pairs.size() * o.objectives.size() * o.protocols.size());
  int64_t computed = 0;
  double compute_seconds = 0;
  std::map<size_t, IriSet> iris;  // per front block, made when first needed
  for (const StitchPair& pair : pairs) {
    const size_t i = pair.front_block(), j = pair.end_block();
    for (const std::string& protocol_name : o.protocols)
      for (const std::string& objective_name : o.objectives) {
        StitchCell c;
        c.front_block = i;
        c.end_block = j;
        c.front_name = front.model->blocks()[i].name;
        c.end_name = end.model->blocks()[j].name;
        c.objective = objective_name;
        c.protocol = protocol_name;
        const std::string cell_path = o.out_dir + "/cells/" + c.key() + ".json";
        const int64_t index = int64_t(cells.size()) + 1;
        const std::string stitch_path = o.out_dir + "/stitches/" + c.key() + ".safetensors";
        if (fs::exists(cell_path)) {
          StitchCell done = cell_from_json(parse_json(read_text(cell_path)));
          if (log) log(cat("[", index, "/", total, "] ", c.key(), ": done before, read ", cell_path));
          if (!scored_on(done, extra_tests)) {  // asked for other test sets than when it ran
            done.test_sets = score_test_sets(extra_tests, pair, *load_stitch(pair, read_stitch_parameters(stitch_path)));
            write_file_atomic(cell_path, to_json(cell_to_json(done), 2) + "\n");
          }
          cells.push_back(done);
          continue;
        }
        const auto started = std::chrono::steady_clock::now();
        const ProtocolRule& rule = protocol(protocol_name);
        const IriSet* set = nullptr;
        if (any_iris) {
          if (!iris.count(i)) {
            iris.emplace(i, iris_for_block(front, i, iri_source, o.iri, o.out_dir, log));
            if (iris.at(i).quality.poor() && log)
              log(cat("WARNING: the IRI set of ", front.name, " block ", i, " is POOR (", iris.at(i).quality.summary(),
                      "): the front model tells x′ from x, so invariance-aware scores for this block are not "
                      "meaningful; use more --iri-steps or --iri-rule adam"));
          }
          set = &iris.at(i);
        }
        const Tensor no_iris;
        const StitchTrainingSet training = rule.training_set({natural, iri_source, set ? set->inputs : no_iris});
        Stitch stitch(pair.shapes());
        initialise(stitch, pair, training, o);
        StitchTrainOptions train = o.train;
        train.objective = objective_name;
        // A progress line at most every 10 seconds of a long cell.
        auto last_line = std::chrono::steady_clock::now();
        const StitchTrainResult r = train_stitch(stitch, pair, training, train, [&](int64_t step, int64_t steps, double loss) {
          const auto now = std::chrono::steady_clock::now();
          if (!log || std::chrono::duration<double>(now - last_line).count() < 10.0) return;
          last_line = now;
          log(cat("[", index, "/", total, "] ", c.key(), ": step ", step, "/", steps, ", loss ", fixed(loss, 4)));
        });
        c.train_images = training.front_inputs.size(0);
        c.final_loss = r.last_epoch_loss;
        c.stitched_accuracy =
            accuracy([&](const Tensor& raw) { return pair.stitched_logits(stitch, raw); }, test.images, test.labels);
        c.end_accuracy = end_accuracy;
        c.relative_score = end_accuracy > 0 ? c.stitched_accuracy / end_accuracy : NAN;
        if (raua) c.raua = area_under_attack([&](const Tensor& raw) { return pair.stitched_logits(stitch, raw); }) / end_area;
        if (set) {
          c.end_agrees_on_iris = accuracy(end_logits, set->inputs, iri_source.labels);
          c.iri_median = set->quality.median;
        }
        c.test_sets = score_test_sets(extra_tests, pair, stitch);
        write_stitch_file(stitch_path, pair, stitch, {{"objective", objective_name}, {"protocol", protocol_name}});
        write_file_atomic(cell_path, to_json(cell_to_json(c), 2) + "\n");
        cells.push_back(c);
        write_tables(o.out_dir, front, end, data.spec, o.test_data, cells);
        compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        ++computed;
        const int64_t left = total - index;
        if (log)
          log(cat("[", index, "/", total, "] ", c.key(), ": stitched ", fixed(100 * c.stitched_accuracy, 2), "%, end ",
                  fixed(100 * end_accuracy, 2), "%, relative ", fixed(c.relative_score, 3), "; ETA ",
                  fixed(compute_seconds / double(computed) * double(left), 0), "s"));
      }
  }
  write_tables(o.out_dir, front, end, data.spec, o.test_data, cells);
  return cells;
}

}  // namespace adjoint
