// Datasets named on the command line, with their standard normalisation and augmentation.
//
//   fashion-mnist[:FOLDER]   IDX files (default /usr/share/datasets/fashion-mnist)
//   mnist:FOLDER             IDX files
//   cifar10:FOLDER           CIFAR-10 binary batches
//   images:ROOT[:SIZE]       ROOT/train/<class>/*, ROOT/test/<class>/* (RGB, SIZE×SIZE, default 32)
//   modadd[:P]               modular addition a + b mod P (default 113), 30% of pairs train
//   text:FILE[:LEN]          byte-level corpus, sequences of LEN (default 64), last 10% test
// Any image data set may be followed by variants made in code, BASE+VARIANT[:ARGS]...
// (engine/data/variants.h: class subsets, a backdoor trigger, ...).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/data/rescale.h"
#include "engine/data/transform.h"

namespace adjoint {

struct DataSource {
  std::string spec;                        // as given
  std::shared_ptr<const Dataset> train, test;
  std::vector<float> mean, std;            // normalisation (empty: none)
  bool images = false;                     // (C, H, W) examples
  // Training augmentation (random crop with padding + flip for images, then the random
  // rescaling of `rescale` where it is active) followed by normalisation, and normalisation
  // alone for evaluation.
  Transforms train_transforms(bool augment, RescaleRange rescale = {}) const;
  Transforms eval_transforms() const;
};

// Which parts of a data set a command reads. TestOnly (eval, predict, analyses) does not
// read the training files; its `train` is the test set, so that shapes, classes and
// normalisation are still there.
enum class DataSplits { TrainAndTest, TestOnly };

// Throws UsageError naming the spec when it is malformed, Error when files are missing.
DataSource open_data(const std::string& spec, DataSplits splits = DataSplits::TrainAndTest);

// The class names of the data set a spec names (variants kept: they relabel, never rename),
// known without reading its files: Fashion-MNIST's and CIFAR-10's names, MNIST's digits, an
// image folder's class folders when the folder is there. Empty for sets without names
// (modadd, text). Throws UsageError for an unknown data set.
std::vector<std::string> class_names_of(const std::string& spec);

// The same, for labelling outputs: empty for an empty spec or an unknown data set.
std::vector<std::string> class_names_if_known(const std::string& spec);

// names[label], or "class <label>" where there is no name.
std::string class_name(const std::vector<std::string>& names, int64_t label);

}  // namespace adjoint
