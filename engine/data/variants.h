// Data-set variants: a data set changed in code, named on the command line after the base
// data set as BASE+VARIANT[:ARG...], several applied left to right
// (`fashion-mnist+classes:0-4+backdoor:0.1:0`).
//
// A variant changes examples as they are decoded (a stamped patch, a relabelling) or keeps
// a subset of them; which examples it touches is a pure function of the example's index, so
// every run, thread count and resume sees the same data. The table in variants.cpp lists them
// with their arguments; `variant_help()` prints it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"

namespace adjoint {

// A dataset whose examples are those of `base`, changed on the fly. Either function may be
// empty (no change). `relabel(index, label)` gives the new label; `change_input(index, label,
// input)` edits the decoded input in place, given the example's original label.
class ModifiedDataset : public Dataset {
public:
  using Relabel = std::function<int64_t(int64_t index, int64_t label)>;
  using ChangeInput = std::function<void(int64_t index, int64_t label, float* input)>;
  ModifiedDataset(std::shared_ptr<const Dataset> base, std::string name, Relabel relabel, ChangeInput change_input);
  std::string name() const override { return name_; }
  int64_t size() const override { return base_->size(); }
  Shape shape() const override { return base_->shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

private:
  std::shared_ptr<const Dataset> base_;
  std::string name_;
  Relabel relabel_;
  ChangeInput change_input_;
};

// Which examples a variant of `fraction` touches: a seeded hash of the index below the
// fraction, so the choice is fixed per example and independent of batching.
bool chosen_example(int64_t index, double fraction, uint64_t salt);

// Applies one variant ("backdoor:0.1:0") to the train and test sets of an image data source,
// in place. `spec` is the whole --data value, for messages. Throws UsageError naming the
// variant and listing the known ones.
struct DataSource;
void apply_variant(DataSource& data, const std::string& variant, const std::string& spec);

// One line per variant: "name:ARGS  what it does", for --help and error messages.
std::string variant_help();

}  // namespace adjoint
