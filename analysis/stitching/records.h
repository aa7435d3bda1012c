// What the stitching sweep writes and reads back, each file validated on reading:
//
//   a cell file     OUT/cells/<cell>.json: one finished cell's scores and the record of
//                   what made it
//   an IRI file     OUT/iris/front_block_<i>.safetensors: an IRI set (x′, x₀, the start
//                   image's index, the relative distance) and its record in the metadata
//   a stitch file   the stitch's weight and bias, the models and blocks it joins, the
//                   checkpoints' content hashes and its record in the metadata
//                   (`adjoint predict --stitch` runs it: analysis/stitching/stitched_model.h)
//
// A record (Provenance, analysis/common/provenance.h) is a map from what changes the numbers
// (the checkpoints' content hashes, the data, the blocks, every option:
// analysis/stitching/provenance.h) to its value.
// A reader throws Error naming the file and the entry at fault for any malformed content,
// NaN weights included: a sweep never reads back a file it cannot trust whole.
//
// This file needs the engine and analysis/common/provenance.cpp alone (no models), so that
// the fuzz targets can link it.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/common/provenance.h"
#include "engine/io/json.h"
#include "engine/tensor.h"

namespace adjoint {

// A cell's accuracies on one of the further test sets.
struct TestSetScore {
  std::string data;
  double stitched_accuracy = 0, end_accuracy = 0;
};

// A value of the sweep's tables: one that was not measured (NaN: a standard cell's IRI
// columns, rAuA not asked for, a layer-map cell not swept) is an empty cell; any other is
// fixed(v, digits) (engine/io/table.h).
std::string measured(double v, int digits);

// One finished cell of the sweep (analysis/stitching/protocol.h). The IRI columns are
// filled on invariance cells alone; elsewhere they are NaN (empty in the tables).
struct StitchCell {
  size_t front_block = 0, end_block = 0;
  std::string front_name, end_name;  // the blocks' names
  std::string objective, protocol;
  int64_t train_images = 0;
  int64_t steps = 0;     // optimizer steps the stitch trained for (0: the initialisation alone)
  double final_loss = NAN;  // mean loss over the last epoch's worth of steps; NaN without steps
  double stitched_accuracy = 0, end_accuracy = 0, relative_score = 0;
  // The IRI set's quality (analysis/stitching/iri.h) and how the end model labels the IRIs:
  // the share labelled y(x) (the image they imitate) and y(x₀) (the image they start from;
  // NaN with noise starts).
  double iri_median = NAN, iri_p90 = NAN, iri_share_below = NAN;
  bool iri_poor = false;
  double end_agrees_on_iris = NAN, end_agrees_with_starts_on_iris = NAN;
  double raua = NAN;  // NaN when the sweep computed no rAuA for the cell
  std::vector<TestSetScore> test_sets;  // in the order of StitchSweepOptions::test_data
  Provenance made;  // what made it
  bool has_iris() const { return std::isfinite(iri_median); }
  std::string key() const;  // "front2_end2_slm_invariance"
};

Json cell_to_json(const StitchCell& cell);
// `path` names the file in errors.
StitchCell cell_from_json(const Json& json, const std::string& path);
// Parses and validates the text of a cell file.
StitchCell read_cell_text(const std::string& text, const std::string& path);

// An IRI set as its file holds it.
struct IriFile {
  Tensor inputs;   // x′ (N, C, H, W) in [0, 1]
  Tensor starts;   // x₀, the same shape
  std::vector<int64_t> start_index;  // x₀'s index in the set, −1 for a noise start
  std::vector<double> distance;      // r(x′) ≥ 0 per image
  Provenance made;
};
void write_iri_file(const std::string& path, const IriFile& file, const std::map<std::string, std::string>& extra = {});
IriFile read_iri_file(const std::string& path);

// A stitch file read back: what it joins, and its parameters.
struct StitchFile {
  std::string path;
  std::string front, end;  // the models' checkpoint paths (relative ones: to the stitch file's folder)
  std::string front_hash, end_hash;  // their content hashes (file_hash); empty in files from before them
  size_t front_block = 0, end_block = 0;
  Tensor weight, bias;
  Provenance made;
};
// Throws Error naming the file and the missing or malformed entry (NaN weights included).
StitchFile read_stitch_file(const std::string& path);
// Only the weight, bias and record (front, end and blocks left empty): what a sweep that
// knows its pair needs.
StitchFile read_stitch_parameters(const std::string& path);

}  // namespace adjoint
