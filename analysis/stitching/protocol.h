// The stitching protocols (docs/methods.md §2.3) as a restartable sweep over stitch points,
// objectives and protocols, with its table on disk.
//
//   standard    the stitch trains on real images (the first `train_images` of the
//               training set); A and B both see x
//   control     the same N natural images the IRI set is made from (the first
//               `iri_images`); isolates the effect of the set's size from that of IRIs
//   invariance  A sees the IRIs x′ of those images, the targets of slm/dm/fula come from B
//               on x′, hlm keeps the label y(x)
//
// Every protocol trains for the same number of optimizer steps (StitchTrainOptions::steps),
// so that a smaller set gets more epochs, not fewer updates; 0 steps leaves the least-squares
// stitch. Every cell (front block i, end block j, objective, protocol) reports the stitched
// model's accuracy on the clean test set, the end model's own accuracy and their ratio (the
// relative score). An invariance cell also reports its IRI set's quality (median and 90th
// percentile relative distance, the share below 0.05, POOR when the median is not below
// 0.05) and how the end model labels the IRIs of A's block i: the share it labels y(x) (the
// image they imitate) and y(x₀) (the image they start from). With `test_data`, the stitched
// and the end model's accuracies on each of those test sets too (data variants such as
// fashion-mnist+shortcut, of the same image shape).
//
// On disk, under out_dir: cells/<cell>.json (one finished cell), stitches/<cell>.safetensors
// (a stitch file, analysis/stitching/stitched_model.h: `adjoint predict --stitch` runs it),
// iris/front_block_<i>.safetensors (an IRI set with its starts and distances) and
// iris/front_block_<i>.png (a few of them beside x and x₀), results.csv, results.json,
// results.md and the layer × layer maps (analysis/stitching/figures.h) rewritten after
// every cell. Every file is written atomically (a temporary renamed into place), so an
// interrupted sweep leaves every table whole, listing the cells finished so far. Every cell,
// IRI set and stitch file records what made it (analysis/stitching/provenance.h); a rerun
// reuses one only when its record is the one the run would write, so that it continues
// where it stopped; a different one is refused in one line naming what differs, or made
// again with `overwrite`. A read-back cell missing one of the test sets is scored on it
// from its stitch file. The results tables list the cells of the current invocation.
//
// Under `mpirun -n K` (engine/distributed/ranks.h) the IRI sets, then the cells, are handed out by
// rank 0 to whichever rank is free; each rank writes the cells, stitches and IRI sets it
// makes, and rank 0 writes the tables (once, when every cell is done: the single process's
// bytes) and alone returns the cells; the other ranks return none.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/common/robustness.h"
#include "analysis/stitching/iri.h"
#include "analysis/stitching/records.h"
#include "analysis/stitching/train.h"
#include "engine/data/open.h"

namespace adjoint {

struct StitchSweepOptions {
  std::vector<std::pair<size_t, size_t>> points;  // (front block, end block)
  std::vector<std::string> objectives = {"hlm", "slm", "dm", "fula"};
  std::vector<std::string> protocols = {"standard", "control", "invariance"};
  int64_t train_images = 5000;  // standard
  int64_t iri_images = 500;     // control and invariance
  int64_t test_images = 0;      // 0: the whole test set
  std::string init = "least-squares";  // least-squares | identity | random
  double ridge = 1e-4;                 // least squares, relative to trace(XᵀX)/in
  int64_t init_images = 500;           // examples of the training set the least squares reads
  StitchTrainOptions train;            // objective is set per cell
  IriOptions iri;
  std::vector<std::string> test_data;  // further test sets (data specs) every cell is scored on
  std::string out_dir;
  std::string commit;      // the commit the program was built from, recorded in every cell
  bool overwrite = false;  // make again a cell, IRI set or stitch made by another run
  // rAuA (docs/methods.md §2.4), when raua_eps is given: every cell also attacks the stitched
  // and the end model with PGD (raua_attack, at each ε of the grid) on the first
  // raua_images test images; raua = AuA(stitched) / AuA(end), AuA by the trapezoid rule.
  std::vector<float> raua_eps;
  int64_t raua_images = 200;
  PgdOptions raua_attack;
};

// Runs (or resumes) the sweep. `log` receives one line per event (progress, warnings).
// Throws Error naming the models, blocks and shapes on a stitch that cannot be built.
std::vector<StitchCell> run_stitch_sweep(const Endpoint& front, const Endpoint& end, const DataSource& data,
                                         const StitchSweepOptions& options,
                                         const std::function<void(const std::string&)>& log = {});

}  // namespace adjoint
