// Datasets: a fixed, indexable list of examples that a Loader batches.
//
// Every dataset decodes one example at a time into caller-owned memory, so a loader can
// decode a batch in parallel (get() is const and thread-safe) and the values of an
// example never depend on which thread or in which order it was decoded. Images are
// float in [0, 1] laid out channel-major (C, H, W); normalisation is a Transform.
// Nothing here downloads anything: every file is read from a folder the caller names.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/shape.h"

namespace adjoint {

class Dataset {
public:
  virtual ~Dataset() = default;

  // "fashion-mnist/train", "cifar10/test", ...: what error messages and logs print.
  virtual std::string name() const = 0;
  virtual int64_t size() const = 0;
  // Shape of one example's input: (C, H, W) for images, (length) for vectors/sequences.
  virtual Shape shape() const = 0;
  virtual int64_t num_classes() const = 0;
  // Labels per example: 1 for classification, the sequence length for next-token targets.
  virtual int64_t target_length() const { return 1; }

  // Writes example `index`'s input (numel(shape()) floats) into `input` and its
  // target_length() labels into `targets`. Thread-safe; throws Error on a bad index or an
  // undecodable example (naming the file).
  virtual void get(int64_t index, float* input, int64_t* targets) const = 0;

  // Classification shorthand: decodes example `index` into `input` and returns its label.
  // Throws unless target_length() is 1.
  int64_t get(int64_t index, float* input) const;
  // The label of a classification example. The default decodes the example; datasets
  // that hold their labels apart override it so that scanning labels costs nothing.
  virtual int64_t label(int64_t index) const;

protected:
  // Throws an Error naming this dataset unless 0 <= index < size().
  void check_index(int64_t index) const;
};

// Classification examples held in memory: `inputs` holds the examples one after another,
// numel(shape) floats each, and `labels` one label per example. Data sets made in code
// (tests) and sets already decoded (the stitch's training images) are this.
class InMemoryDataset : public Dataset {
public:
  // Throws Error naming the data set when inputs and labels disagree in count or a label is
  // outside [0, num_classes).
  InMemoryDataset(std::string name, Shape shape, std::vector<float> inputs, std::vector<int64_t> labels,
                  int64_t num_classes);
  std::string name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape shape() const override { return shape_; }
  int64_t num_classes() const override { return num_classes_; }
  using Dataset::get;
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

private:
  std::string name_;
  Shape shape_;
  std::vector<float> inputs_;
  std::vector<int64_t> labels_;
  int64_t num_classes_;
};

// The examples of `base` at `indices` (in that order): class subsets, curricula, splits.
class Subset : public Dataset {
public:
  Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices, std::string name = "");
  std::string name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Shape shape() const override { return base_->shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int64_t target_length() const override { return base_->target_length(); }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
  std::string name_;
};

// Reads a whole file. Gzip-compressed files are inflated transparently (zlib reads plain
// files as they are), so callers accept "x" and "x.gz" alike. Errors name the file.
std::vector<uint8_t> read_file(const std::string& path);

// `path` if it exists, else `path + ".gz"` if that exists, else an Error naming both.
std::string find_file_or_gz(const std::string& path);

}  // namespace adjoint
