// `adjoint stitch`: model stitching between two checkpoints under the standard, control
// and invariance-aware protocols (docs/methods.md §2). The work is in analysis/stitching_*;
// this file turns options into a sweep and its lines into output.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "analysis/stitching/protocol.h"
#include "analysis/stitching/records.h"
#include "engine/distributed/ranks.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "models/checkpoint.h"
#include "models/model_source.h"
#include "tools/attack_options.h"
#include "tools/cli.h"
#include "tools/commit.h"  // generated at build time (tools/meson.build): ADJOINT_COMMIT
#include "tools/folder_lock.h"
#include "tools/html_report.h"

namespace adjoint {
namespace {

// A frozen model from its checkpoint; *data_spec receives the data set it was trained on.
Endpoint load_endpoint(const std::string& path, std::string* data_spec) {
  const LoadedModel m = load_checkpoint_model(path);
  // Frozen: the IRI search, the attacks and stitch training differentiate through A and B
  // for their inputs alone, and nothing may move them.
  m.model->freeze();
  *data_spec = m.data_spec;
  return {path, m.model, m.mean, m.std, file_hash(path)};
}

// Option values checked where they are read, so that a bad one is refused before any work
// (exit 2) in one line naming it, never turned into a NaN stitch reported as a score.
int64_t count_option(const cli::Args& a, const char* name, int64_t least, const char* meaning = "") {
  const int64_t v = a.integer(name);
  if (v < least) throw UsageError(cat("option --", name, " must be at least ", least, meaning, ", got ", v));
  return v;
}

double number_option(const cli::Args& a, const char* name, bool zero_allowed) {
  const double v = a.number(name);
  if (!(std::isfinite(v) && (v > 0 || (zero_allowed && v == 0))))
    throw UsageError(cat("option --", name, " must be a finite number ", zero_allowed ? "at least 0" : "above 0", ", got ",
                         a.text(name)));
  return v;
}

// A list option whose entries must differ ("hlm,hlm" would run one cell twice).
std::vector<std::string> distinct_list(const cli::Args& a, const char* name) {
  std::vector<std::string> items = a.list(name);
  for (size_t k = 0; k < items.size(); ++k)
    if (std::find(items.begin(), items.begin() + k, items[k]) != items.begin() + k)
      throw UsageError(cat("option --", name, ": '", items[k], "' is given twice"));
  return items;
}

// The transports the IRI search may carry its cotangent with (--iri-transport).
struct NamedTransport {
  const char* name;
  Transport transport;
};
const NamedTransport kIriTransports[] = {
    {"gradient", Transport::gradient()},
    {"soft_pullback", Transport::soft_pullback()},
    {"pullback", Transport::pullback()},
};

Transport iri_transport(const std::string& name) {
  std::string names;
  for (const NamedTransport& t : kIriTransports) {
    if (name == t.name) return t.transport;
    names += cat(names.empty() ? "" : ", ", t.name);
  }
  throw UsageError(cat("--iri-transport: unknown transport '", name, "'; transports: ", names));
}

// A block given by index ("3") or by name ("layer2.0").
size_t block_of(const Endpoint& e, const std::string& text, const char* option) {
  if (text.empty()) throw UsageError(cat("--", option, ": an empty block"));
  if (text.find_first_not_of("0123456789") != std::string::npos) return e.model->block_index(text);
  try {
    return size_t(std::stoull(text));
  } catch (const std::exception&) {
    throw UsageError(cat("--", option, ": '", text, "' is not a block index"));
  }
}

std::vector<std::pair<size_t, size_t>> stitch_points(const cli::Args& a, const Endpoint& front, const Endpoint& end) {
  if (a.has("blocks") == a.has("pairs")) throw UsageError("stitch: give --blocks I,J,... or --pairs I:J,..., one of them");
  std::vector<std::pair<size_t, size_t>> points;
  if (a.has("blocks"))
    for (const std::string& b : a.list("blocks")) points.emplace_back(block_of(front, b, "blocks"), block_of(end, b, "blocks"));
  else
    for (const std::string& p : a.list("pairs")) {
      const size_t colon = p.find(':');
      if (colon == std::string::npos) throw UsageError(cat("--pairs: '", p, "' is not FRONT:END"));
      points.emplace_back(block_of(front, p.substr(0, colon), "pairs"), block_of(end, p.substr(colon + 1), "pairs"));
    }
  for (size_t k = 0; k < points.size(); ++k)
    if (std::find(points.begin(), points.begin() + k, points[k]) != points.begin() + k)
      throw UsageError(cat("option --", a.has("blocks") ? "blocks" : "pairs", ": the stitch point front block ",
                           points[k].first, " → end block ", points[k].second, " is given twice"));
  return points;
}

int run_stitch(const cli::Args& a) {
  std::string front_data, end_data;
  const Endpoint front = load_endpoint(a.text("front"), &front_data), end = load_endpoint(a.text("end"), &end_data);
  StitchSweepOptions o;
  o.points = stitch_points(a, front, end);
  o.objectives = distinct_list(a, "objectives");
  o.protocols = distinct_list(a, "protocol");
  o.out_dir = a.text("out");
  o.commit = ADJOINT_COMMIT;
  o.overwrite = a.flag("overwrite");
  o.train_images = count_option(a, "train-images", 0, " (0: the whole training set)");
  o.iri_images = count_option(a, "iri-images", 0);
  o.test_images = count_option(a, "test-images", 0, " (0: the whole test set)");
  o.init = a.text("init");
  o.ridge = number_option(a, "ridge", true);
  if (a.has("epochs") && a.has("steps"))
    throw UsageError("give --steps (the same for every protocol) or --epochs (passes over each protocol's set), not both");
  o.train.steps = count_option(a, "steps", 0, " (0: the least-squares stitch alone)");
  if (a.has("epochs")) o.train.epochs = count_option(a, "epochs", 0, " (0: the least-squares stitch alone)");
  o.train.batch = count_option(a, "batch", 1);
  o.train.lr = number_option(a, "lr", false);
  o.train.seed = uint64_t(count_option(a, "seed", 0));
  o.train.objective_options.temperature = number_option(a, "temperature", false);
  if (a.has("fula-weights"))
    for (float w : parse_floats(a.text("fula-weights"), "fula-weights")) {
      if (!(std::isfinite(w) && w >= 0))
        throw UsageError(cat("option --fula-weights: every weight must be a finite number at least 0, got ", w));
      o.train.objective_options.fula_weights.push_back(w);
    }
  o.train.objective_options.fula_normalise = !a.flag("fula-raw");
  o.iri.search.rule = a.text("iri-rule");
  o.iri.search.steps = count_option(a, "iri-steps", 1);
  o.iri.search.step = float(number_option(a, "iri-step", true));
  o.iri.search.transport = iri_transport(a.text("iri-transport"));
  o.iri.start = a.text("iri-start");
  o.iri.batch = count_option(a, "iri-batch", 1);
  o.iri.seed = o.train.seed;
  if (a.has("raua-eps")) {
    o.raua_eps = eps_grid(a, "raua-eps");
    o.raua_attack = attack_options(a, o.raua_eps.front(), o.train.seed);
    o.raua_images = count_option(a, "raua-images", 1);
  }
  if (a.has("test-data")) o.test_data = distinct_list(a, "test-data");
  const std::string spec = a.has("data") ? a.text("data") : front_data;
  if (spec.empty()) throw UsageError("stitch: the front checkpoint names no data set; give --data");
  const DataSource data = open_data(spec);
  const auto lock = cli::lock_output_folder(o.out_dir);
  std::printf("adjoint stitch: %s → %s on %s, %zu stitch points × %zu objectives × %zu protocols; writing %s\n",
              front.name.c_str(), end.name.c_str(), spec.c_str(), o.points.size(), o.objectives.size(),
              o.protocols.size(), o.out_dir.c_str());
  std::fflush(stdout);
  run_stitch_sweep(front, end, data, o, [](const std::string& line) {
    std::FILE* stream = line.rfind("WARNING", 0) == 0 ? stderr : stdout;
    std::fprintf(stream, "%s\n", line.c_str());
    std::fflush(stream);
  });
  if (distributed::rank() != 0) return 0;  // rank 0 wrote the tables and writes the report
  std::printf("done: %s/results.md, results.csv, results.json; stitches in %s/stitches\n", o.out_dir.c_str(),
              o.out_dir.c_str());
  cli::HtmlReport page = cli::folder_report(o.out_dir, cat("adjoint stitch: ", front.name, " -> ", end.name, " on ", spec));
  cli::add_figures(page, o.out_dir + "/iris");
  cli::write_html_report(o.out_dir, a, page);
  return 0;
}

const cli::Registration stitch_command({
    .name = "stitch",
    .summary = "stitch two checkpoints block to block: standard, control and invariance-aware (IRI) protocols",
    .description =
        "Trains an affine stitch from the front model's block I into the end model's block J (1×1 conv on\n"
        "feature maps, per-token linear on tokens; area/bilinear resize where sizes differ) on each objective\n"
        "(hlm, slm, dm, fula) under each protocol: standard (real images), control (the N images the IRIs\n"
        "imitate), invariance (the front model's identically represented inputs). Blocks are indices or names\n"
        "(adjoint info lists them). Between a CNN's maps and a ViT's tokens the map is resized to the patch\n"
        "grid (the class token into the ViT: the mean of the patch tokens; out of it: dropped); between ViTs\n"
        "of other grids the patch grid is resized and the class token kept. Every protocol trains for the\n"
        "same --steps. Writes OUT/results.{csv,json,md} (invariance rows also: the IRI set's relative\n"
        "distances, POOR when their median is not below 0.05, and the share of IRIs the end model labels\n"
        "y(x), the image imitated, and y(x0), the start), the layer x layer maps\n"
        "OUT/layer_map_<objective>_<protocol>.{csv,png} and OUT/layer_maps.md, OUT/stitches/*.safetensors\n"
        "(adjoint predict/explain --stitch run them) and OUT/iris/front_block_<i>.{safetensors,png}. Every\n"
        "cell, IRI set and stitch records what made it (the checkpoints' content hashes, the data, every\n"
        "option that changes its numbers): a rerun with the same OUT reuses each whose record matches, and\n"
        "refuses one made otherwise unless --overwrite.",
    .arguments = "",
    .options = with_attack_options({{"front", "FILE", "the front model's checkpoint (A)", ""},
                {"end", "FILE", "the end model's checkpoint (B)", ""},
                {"blocks", "LIST", "stitch after the same block of both: 1,2,3", ""},
                {"pairs", "LIST", "stitch after front block I into end block J: I:J,...", ""},
                {"objectives", "LIST", "hlm, slm, dm, fula", "hlm,slm,dm,fula"},
                {"protocol", "LIST", "standard, control, invariance", "standard,control,invariance"},
                {"out", "DIR", "where tables, stitches and IRIs go", "runs/stitch"},
                {"overwrite", "", "make again the cells, IRI sets and stitches in OUT that another run's settings made", ""},
                {"data", "SPEC", "the data set (default: the front checkpoint's)", ""},
                {"train-images", "N", "training images of the standard protocol (0: all)", "5000"},
                {"iri-images", "N", "images of the IRI set and of the control protocol", "500"},
                {"test-images", "N", "test images scored (0: all)", "0"},
                {"test-data", "LIST", "further test sets scored, data specs (e.g. fashion-mnist+shortcut)", ""},
                {"init", "NAME", "least-squares, identity or random", "least-squares"},
                {"ridge", "X", "least-squares ridge, relative to trace(XᵀX)/channels", "1e-4"},
                {"steps", "N", "stitch training steps, the same under every protocol (0: the least-squares stitch)", "200"},
                {"epochs", "N", "instead of --steps: passes over each protocol's own set (fewer steps on smaller sets)", ""},
                {"batch", "N", "stitch training batch", "128"},
                {"lr", "X", "stitch AdamW learning rate", "1e-3"},
                {"temperature", "X", "slm temperature", "1"},
                {"fula-weights", "LIST", "fula weight per term, stitch point to penultimate block (default all 1)", ""},
                {"fula-raw", "", "fula terms without the ‖B_l(x)‖² normalisation", ""},
                {"iri-rule", "NAME", "IRI search: l2 (normalised L2 steps) or adam", "l2"},
                {"iri-steps", "N", "IRI search iterations", "1000"},
                {"iri-step", "X", "l2 step length or Adam rate in [0,1] pixel units (0: 0.5·sqrt(D/3072))", "0"},
                {"iri-start", "NAME", "derangement (another image of the set) or noise", "derangement"},
                {"iri-transport", "NAME", "IRI search cotangent: gradient, soft_pullback or pullback", "gradient"},
                {"iri-batch", "N", "images per IRI search batch", "128"},
                {"seed", "N", "stitch training order, random init, IRI starts", "0"},
                {"raua-eps", "LIST", "also rAuA per cell: PGD (--pgd-*) at each ε of LIST, e.g. 0,0.025,0.05,0.1", ""},
                {"raua-images", "N", "test images attacked for rAuA", "200"}}),
    .run = run_stitch,
});

}  // namespace
}  // namespace adjoint
