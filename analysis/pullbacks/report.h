// Explanation reports: run explanation methods over a set of images, score them with the
// quality metrics and write what a person (PNG heat-maps, overlays, counterfactuals,
// contact sheets, a Markdown table) and a program (attributions as safetensors, the table
// as CSV and JSON) need. `adjoint explain` is a thin command line over explain_report().
//
// Fairness between methods: the metrics that perturb the input are split into a probe
// (the model's responses to the perturbations) and a score (analysis/pullbacks/metrics.h); a probe
// is made once per batch and scores every method, so all methods are compared on the same
// perturbations. Every random draw is keyed by the image's index in the whole set, so the
// batch size changes no score.
//
// Cost control: the metrics whose cost grows with the method's own cost or with the
// model's depth (max-sensitivity, monotonicity, randomisation, focus) run on the first
// `expensive_count` images only, and the table says so.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/common/heatmap.h"
#include "analysis/common/provenance.h"
#include "analysis/pullbacks/cells.h"
#include "analysis/pullbacks/explain.h"
#include "analysis/pullbacks/metrics.h"
#include "analysis/pullbacks/protocol.h"
#include "models/model.h"

namespace adjoint {

// ---- metric tables -------------------------------------------------------------------

// One metric's column: what it is, on how many images it was computed and how.
struct MetricColumn {
  MetricInfo info;
  int64_t images = 0;            // images (or mosaics, for focus) each method was scored on
  std::string note;              // how it was computed, when that differs from the defaults
  std::string unit = "images";   // what `images` counts ("mosaics" for focus)
};

struct MetricRow {
  std::string method, metric;
  Summary summary;
};

// A figure of the model itself rather than of a method, measured beside a metric: the share
// of the focus mosaics it recognises (analysis/pullbacks/focus.h), which focus presumes.
struct ModelFigure {
  MetricColumn column;
  Summary summary;
};

struct MetricTable {
  std::vector<std::string> methods;   // row order
  std::vector<MetricColumn> metrics;  // column order
  std::vector<MetricRow> rows;        // one per method × metric that was computed
  std::vector<ModelFigure> model_figures;  // after the methods' rows, their method "model"
  std::vector<std::pair<std::string, std::string>> context;  // model, data, images, seed, ...
  double confidence = 0.95;
  const MetricRow* find(const std::string& method, const std::string& metric) const;
};

// "↑" when higher is better, "↓" when lower is better.
std::string direction_arrow(const MetricInfo& info);

// CSV: one line per method × metric with the direction, mean, std, confidence interval,
// defined and undefined counts, images and note, then one per model figure with the method
// "model". NaN prints as "nan".
std::string table_csv(const MetricTable& table);
// JSON: {"context", "confidence", "metrics": [{name, higher_is_better, direction,
// description, images, note}], "results": [{method, metric, mean, std, ci_low, ci_high,
// count, undefined}]}; undefined numbers are null.
std::string table_json(const MetricTable& table);
// Markdown: a summary grid (methods × metrics, means, the best of each metric in bold,
// arrows in the header), then one section per metric with mean ± std, the confidence
// interval and the counts.
std::string table_markdown(const MetricTable& table);

// ---- the metric table ---------------------------------------------------------------------

struct ReportOptions;
// What the metrics' steps work on (defined in report_run.h): the whole run (the model, the
// images and their targets, the metrics' settings), one batch of images with its probes,
// one method's maps of a batch, and what a batch's cost depends on.
struct ReportRun;
struct ReportBatch;
struct MethodMaps;
struct BatchCounts;

// One metric as a report runs it. The table of them, report_metrics(), is the one place
// that says which metrics probe, how each scores a map, what each costs and how the
// command line names and describes it: explain_report, report_cost and `adjoint explain`
// (its default metrics and --help) all read it.
struct ReportMetric {
  MetricInfo info{};          // the catalogue's name, direction and description
  std::string alias{};        // a shorter name also accepted; empty when none
  bool expensive = false;     // runs on the first expensive_count images only
  bool by_default = false;    // runs when no metric is named (`adjoint explain` without --metrics)
  bool on_mosaics = false;    // scored on mosaics of the images rather than on the images
  bool reads_classes = false; // reads the model's class count (ReportRun::classes)
  std::string help{};         // its line in `adjoint explain --help`
  // Once per report, before the first batch (focus draws its mosaics); null: nothing.
  void (*prepare)(ReportRun& run) = nullptr;
  // Once per batch: the model's responses to the batch's perturbations, which score every
  // method on the same draws; null: the metric needs no probe.
  void (*probe)(const ReportRun& run, ReportBatch& batch) = nullptr;
  // Per method and batch: the scores of the batch's images, or nothing when the metric
  // does not run on this batch (past the expensive set, one class only).
  std::optional<MetricResult> (*score)(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps) = nullptr;
  // A batch's cost in forward+backward passes of one image: the probe's passes (null: 0),
  // and the explanations the metric asks of a method (null: 0), each at the method's cost.
  double (*probe_passes)(const BatchCounts& counts) = nullptr;
  double (*explanations)(const BatchCounts& counts) = nullptr;
  // How it was computed, for the table (null: nothing to say).
  std::string (*note)(const ReportRun& run) = nullptr;
  // A figure of the model measured with the metric, for the table (null, or nothing: none).
  std::optional<ModelFigure> (*model_figure)(const ReportRun& run, double confidence) = nullptr;
  // In cells (ReportOptions::cells), whether each method's scores of a batch's expensive
  // images are cells of their own (pieces, cells.h): whole, or a few steps each.
  enum class Pieces { None, Whole, ByStep };
  Pieces pieces = Pieces::None;
};

// Every metric of the catalogue (analysis/pullbacks/metrics.h), in its order: the table's columns.
const std::vector<ReportMetric>& report_metrics();
// The row of a name or alias; nullptr for an unknown name.
const ReportMetric* find_report_metric(const std::string& name);

// ---- names -------------------------------------------------------------------------------

// Checked names: a UsageError listing the known ones for an unknown name or a repeat.
std::vector<std::string> resolve_metrics(const std::vector<std::string>& names);
std::vector<std::string> resolve_methods(const std::vector<std::string>& names);
// The metrics that run on `expensive_count` images only.
bool is_expensive_metric(const std::string& metric);

// ---- the report ------------------------------------------------------------------------

struct ReportOptions {
  std::vector<std::string> methods;  // explanation methods; empty: all of explanation_methods()
  std::vector<std::string> metrics;  // metric names (report_metrics(), aliases too); empty: none
  ExplainOptions explain;            // temperatures, ascent, SmoothGrad, IG, Grad-CAM, range, seed

  // Targets: the predicted class, or one class for every image, or the data's labels.
  enum class Target { Predicted, Fixed, Label };
  Target target = Target::Predicted;
  int64_t target_class = 0;  // for Target::Fixed

  int64_t batch_size = 32;       // images per explanation call
  int64_t perturbations = 50;    // infidelity perturbations per image, split over the patch sizes
  MetricSettings metric_settings;  // the metrics' constants (analysis/pullbacks/protocol.h)
  int64_t expensive_count = 0;   // expensive metrics on the first N images (0: all)
  int64_t randomisation_layers = 0;  // layers re-initialised top-down (0: all)
  uint64_t metric_seed = 0;

  // Files. Nothing is written when out_dir is empty.
  std::string out_dir;
  int64_t picture_images = -1;     // PNGs for the first N images (-1: all, 0: none)
  bool write_attributions = true;  // attributions_<method>.safetensors with every image
  bool write_tables = true;        // metrics.csv/.json/.md when metrics were computed
  Normalisation normalisation;     // to show inputs and counterfactuals as images
  std::vector<std::string> class_names;  // the pictures' class labels (empty: "class k")
  int64_t scale = 0;               // enlargement of the pictures (0: default_scale)
  std::vector<std::pair<std::string, std::string>> context;  // copied into the table
  // Called once every map and score is made and the pictures and tables are on disk, with
  // the report's files, while the report's writer thread writes those of maps (with one
  // thread: before it does). The methods' memory is free from then on: explain writes its
  // page and hands that memory back to the system meanwhile.
  std::function<void(const std::vector<std::string>& files)> beside_last_files;

  // In cells (analysis/pullbacks/cells.h): each batch of images is a cell, written to
  // out_dir/cells/ when finished and reused by a rerun whose record matches; the cells are
  // handed out over the job's ranks (engine/distributed/ranks.h), and rank 0 makes the tables
  // from them in image order, so they are the same bytes at any rank count. Needs out_dir;
  // refuses write_attributions (the maps of a cell are not kept).
  struct Cells {
    bool enabled = false;
    // What the caller knows made the numbers (the checkpoint's content hash, the data, the
    // commit); report_record adds every option of these ReportOptions.
    Provenance identity;
    bool overwrite = false;  // remake cells made by another run instead of refusing
    std::function<void(const std::string&)> log;  // "remaking …", "… done before"
  } cells;
};

// Progress: `done` of `total` work items (an item is one image under one method), and
// `work`, the share of the estimated cost (report_cost) spent so far, in [0, 1]: items are
// far from equal (the expensive metrics run on the first images only), so an ETA should
// follow `work`.
using ReportProgress = std::function<void(int64_t done, int64_t total, double work, const std::string& what)>;

// Where a report's wall-clock time went, in seconds, on this rank: the methods' maps (what
// the explanation itself costs), the metrics (probes and scores, their explanations of
// perturbed inputs included) and the pictures (drawn and encoded). The rest of a run (the
// targets' forward pass, the files of maps and tables) is the report's total less these.
struct ReportTimes {
  double methods = 0, metrics = 0, pictures = 0, total = 0;
};

struct ReportResult {
  std::vector<int64_t> targets;    // the class explained for each image
  MetricTable table;               // empty rows when no metric was asked for
  std::vector<std::string> files;  // every file written, in order
  ReportTimes times;               // of the batches this rank ran (none for cells made before)
};

// The record of a report's cells: options.cells.identity and every option that changes a
// cell's numbers or pictures, for `images` images.
Provenance report_record(const ReportOptions& options, int64_t images);

// Explains every image of x (N, C, H, W) with every method, scores the maps and writes the
// files. `labels` (one per image, or empty when unknown) serve Target::Label and the
// focus mosaics (the targets stand in for them when empty). The model must be in eval
// mode. Throws UsageError for unknown method or metric names.
//
// Files under out_dir: image_<i>/input.png, image_<i>/<method>.png (heat-map),
// image_<i>/<method>_overlay.png, image_<i>/<method>_counterfactual.png (the two ascent
// methods), image_<i>/sheet.png (every method side by side); attributions_<method>.safetensors
// (tensors "attributions" (N, C, H, W), "inputs", "targets" as float, and
// "counterfactuals" for the ascent methods); metrics.csv, metrics.json, metrics.md.
// With options.cells: also cells/images_<a>-<b>.json; the call returns on every rank once
// every cell is done, and only rank 0's result holds the table and the files.
ReportResult explain_report(const Model& model, const Tensor& x, const std::vector<int64_t>& labels,
                            const ReportOptions& options, const ReportProgress& progress = {});

// The report's cost in forward+backward passes of one image, for an estimate: the
// explanations, the probes (a forward pass counted as a third of a pass) and the metrics
// that explain again. `layers` is the number of layers randomisation may re-initialise.
double report_cost(const ReportOptions& options, int64_t images, int64_t height, int64_t width, int64_t layers);
// The same cost batch by batch (report_cost is their sum): the first batches carry the
// expensive metrics, so they cost the most.
std::vector<double> report_batch_costs(const ReportOptions& options, int64_t images, int64_t height, int64_t width,
                                       int64_t layers);
// Passes that every rank spends whatever the number of ranks, beside the batches: the
// forward pass that finds the predicted class of every image (a third of a pass each; none
// for fixed or label targets, nor where the first method finds them in its own pass: no
// metrics and a method of explains_in_one_pass), which each rank makes for all the images.
double report_unshared_cost(const ReportOptions& options, int64_t images);
// The cells of a report run in cells (ReportOptions::cells), in the order they are handed out
// (the costliest first), each with its cost in passes: every batch, and apart from it the
// pieces of its expensive images (cells.h: per method, max-sensitivity whole and
// randomisation a few layers at a time, each piece making the method's maps again). They
// follow from the options, the image count and the model's layers alone, never from the
// number of ranks.
struct ReportCell {
  ImageRange images;
  std::optional<MetricPiece> piece;
  double cost = 0;
};
std::vector<ReportCell> report_cells(const ReportOptions& options, int64_t images, int64_t height, int64_t width,
                                     int64_t layers);
// The costs of report_cells, or of report_batch_costs without cells: what ranks share.
std::vector<double> report_work_costs(const ReportOptions& options, int64_t images, int64_t height, int64_t width,
                                      int64_t layers);
// The cost of batches shared out over `ranks` as distributed::for_each_item hands them out
// (in order, each to the rank that is free first): the busiest rank's sum. One rank: the sum.
double shared_cost(const std::vector<double>& batch_costs, int64_t ranks);
// The seconds the pictures of a report take (options.picture_images images, -1: all): one
// overlay of a random map drawn and encoded here, times the tiles the report draws (each
// picture once alone and once in its image's contact sheet), shared by the worker threads.
double picture_seconds(const ReportOptions& options, int64_t images, int64_t height, int64_t width);
// The seconds of one image's forward+backward pass (a gradient), measured on the first
// `batch` images of `x` after a warm-up call: the unit report_cost's passes are counted in.
double seconds_per_image_pass(const Model& model, const Tensor& x, int64_t batch);
// One explanation's cost in passes per image.
double method_cost(const std::string& method, const ExplainOptions& options);

}  // namespace adjoint
