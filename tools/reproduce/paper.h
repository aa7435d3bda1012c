// `adjoint reproduce`: a paper as data. A paper is a list of parts (each one command line of
// the existing `adjoint` commands, writing into its own folder) and a list of claims (each
// one line of the paper, its figure there, and how our number is read from the parts'
// result files). tools/reproduce/runner.h runs the parts restartably and judges the claims;
// one file per paper (tools/reproduce/<paper>.cpp) fills the table of papers.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace adjoint::reproduce {

// How big the models and runs are: quick (the same page in minutes) or full (the headline
// claims at the papers' protocol, sized for an hour on 2 cores).
enum class Scale { Quick, Full };
const char* scale_name(Scale scale);
Scale parse_scale(const std::string& name);  // UsageError naming the option for anything else

// One step of a paper: an `adjoint` command line. In its words, "{out}" is the part's own
// folder (DIR/parts/<name>) and "{parts}" the folder of all parts, so a part names the
// outputs of the parts before it as "{parts}/<name>/...".
struct Part {
  std::string name;                // a folder name: letters, digits, '_' and '-'
  std::vector<std::string> words;  // the command and its options, without "adjoint"
  double expected_seconds = 1;     // the part's share of the ETA (quick: as measured here)
};

// Where a claim holds: our value above or below a bound.
struct Bound {
  enum Side { AtLeast, AtMost } side = AtLeast;
  double value = 0;
};

// What a claim presumes of the parts, judged per seed like the claim: where it fails, the
// claim's number says nothing about the paper's claim, and the table says so rather than
// that the claim does not hold (focus presumes models that recognise the mosaics' tiles).
struct Premise {
  std::string text;  // what is presumed, in one line
  std::string ours;  // what the number is, in one line
  std::function<double(const std::string& parts_dir, int seed)> value;
  Bound bound;       // the premise holds where every seed's value is on this side
};

// One claim of a paper, judged per seed from the parts' result files.
struct Claim {
  std::string text;          // the paper's claim in one line
  std::string paper_figure;  // where and what the paper reports
  std::string ours;          // what our number is, in one line
  // The parts the number is read from, with "{seed}" for the seed's index: each must be a
  // part of the paper at every scale (tests/test_reproduce.cpp checks it).
  std::vector<std::string> sources;
  // Our number for seed `seed`, read from the files under `parts_dir`; throws Error naming
  // the file when a result is missing.
  std::function<double(const std::string& parts_dir, int seed)> value;
  Bound bound;  // the claim holds here when every seed's value is on this side of the bound
  std::optional<Premise> premise;  // none: the claim presumes nothing it can measure
};

// The user's own ImageNet folder and pretrained weights, where a paper's published setting
// is ImageNet (`reproduce PAPER --imagenet ROOT --weights MODEL=FILE,...`).
struct ImagenetSetting {
  std::string root;  // holds val/<wnid>/*
  std::vector<std::pair<std::string, std::string>> weights;  // model name → weights file, as given
  int64_t count = 0;      // images per model; 0: the evaluation protocol's (1000 at 224 pixels)
  double width = 1;       // channel multiplier of the models (1: the published ones)
  int64_t classes = 1000;  // classes of the models' heads
  // The explanation methods and metrics evaluated; empty: all of them (the paper's full table).
  std::vector<std::string> methods, metrics;
};

struct Paper {
  std::string name;   // the command's argument: "stitching"
  std::string title;  // the paper in a line
  std::vector<Claim> claims;
  // The parts at a scale for `seeds` seeds, in the order they run (a part only reads parts before it).
  std::function<std::vector<Part>(Scale scale, int seeds)> parts;
  // Draws the summary figures from the parts' results into `figures_dir`; returns their
  // paths without extension (each written as .png and .svg through analysis/common/figure.h).
  std::function<std::vector<std::string>(const std::string& parts_dir, int seeds, const std::string& figures_dir)>
      draw;
  // The paper at its published ImageNet setting on the user's data and weights: one seed,
  // no scale, each part's expected_seconds estimated from the report's cost model and a
  // measured pass. UsageError naming the option for a model it does not know or a folder
  // that is not ImageNet's layout. Empty where the paper has no such setting.
  std::function<Paper(const ImagenetSetting& setting)> on_imagenet;
  int default_seeds[2] = {1, 3};  // quick, full
  // Wall time of the whole paper here (2 shared cores): quick as measured, full estimated
  // from the quick parts' measured times; both said in `reproduce --list`.
  std::string quick_time, full_time;
  // Lines printed beneath an ImageNet setting's estimate: each model's and the job's over
  // ranks (empty: none).
  std::vector<std::string> estimate_lines;
};

// The table of papers.
const std::vector<Paper>& papers();
const Paper& find_paper(const std::string& name);  // UsageError listing the papers

// The papers' own definitions, one file each.
Paper semantic_pullbacks_paper();
Paper stitching_paper();
Paper tensor_similarity_paper();

// "{seed}" in `pattern` replaced by the seed's index.
std::string with_seed(const std::string& pattern, int seed);

// Reading results: one row of a CSV file.
struct CsvRows {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string path;
  // The value of `column` in the first row whose columns equal `match` ({column, value}
  // pairs); an Error naming the file and the row when there is none or it is no number.
  double number(const std::string& column, const std::vector<std::pair<std::string, std::string>>& match) const;
  size_t column(const std::string& name) const;  // Error naming the file when absent
};
CsvRows read_csv(const std::string& path);  // Error naming the file when missing

}  // namespace adjoint::reproduce
