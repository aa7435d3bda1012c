// The cells of an explanation report that runs in pieces (`adjoint explain --evaluate`,
// also spread over ranks under mpirun: analysis/pullbacks/report.h).
//
// A cell is one batch of images, [first, first + count), or a piece of a batch's expensive
// work (MetricPiece below): the cells follow from the options, the image count, the batch
// size and the model's layers alone, never from how many processes share the work. A finished
// cell is written atomically to OUT/cells/images_<a>-<b>.json (a, b: its first and last
// image) with the metric values of its images under every method, each as the shortest
// text that reads back as the same double (so the tables made from cells are the tables
// made in one go, to the bit), the pictures it drew, and the record of what made it
// (analysis/common/provenance.h). A rerun reuses a cell only when that record matches.
//
// The reader validates the whole file and throws Error naming the file for anything
// malformed. This file needs the engine and analysis/common/provenance.cpp alone, so
// that a fuzz target can link it (fuzz/fuzz_explain_cell.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/common/provenance.h"

namespace adjoint {

// Images [first, first + count) of the set.
struct ImageRange {
  int64_t first = 0, count = 0;
  bool operator==(const ImageRange&) const = default;
};

// The cells of `images` images in batches of `batch`: [0, batch), [batch, 2·batch), …
std::vector<ImageRange> image_cells(int64_t images, int64_t batch);

// A piece of a batch's work that runs as a cell of its own: one method's scores by one
// metric of the batch's expensive images, and for model-parameter randomisation only steps
// [first_step, first_step + steps) of it. The metrics that explain each expensive image many
// times over (randomisation once per layer, max-sensitivity once per sample) are most of an
// evaluation's cost; in pieces, more ranks than there are batches share them. Its scores are,
// for its method, the metric's values, or one entry per step (piece_step_key).
struct MetricPiece {
  std::string metric, method;
  int64_t first_step = 0, steps = 0;  // steps 0: the whole metric
  bool operator==(const MetricPiece&) const = default;
};

// "images_0032-0063.json": the cell's file name in OUT/cells/; a piece's
// "images_0032-0063.max_sensitivity.gradient.json" or
// "images_0032-0063.model_parameter_randomisation.gradient.steps_016-023.json".
std::string cell_file_name(const ImageRange& range, const std::optional<MetricPiece>& piece = std::nullopt);

// "randomisation_step_016": a piece's score entry of step 16.
std::string piece_step_key(int64_t step);

// Per method, per metric: the values of the cell's images in image order (of its mosaics,
// for focus); NaN where a metric is undefined. A metric that does not run on the cell (past
// the expensive images) has no entry.
using CellScores = std::map<std::string, std::map<std::string, std::vector<double>>>;

struct ImageCell {
  ImageRange images;
  std::optional<MetricPiece> piece;  // none: the batch's own cell
  CellScores scores;
  std::vector<std::string> files;  // the pictures it drew, relative to the report's folder
  Provenance made;                 // what made it
};

// The cell file's text (JSON), and back. The reader throws Error naming `path` and the entry
// at fault: not JSON, a missing or mistyped entry, a value that is not a number's text, a
// picture path that leaves the report's folder, a piece whose metric or method is not a name.
std::string image_cell_text(const ImageCell& cell);
ImageCell read_image_cell_text(const std::string& text, const std::string& path);

}  // namespace adjoint
