// CIFAR-10 in its "binary version": each record is one label byte followed by
// 3 × 32 × 32 pixel bytes, red plane then green then blue, rows top to bottom. The
// training split is data_batch_1.bin … data_batch_5.bin, the test split test_batch.bin.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"

namespace adjoint {

class Cifar10 : public Dataset {
public:
  static constexpr int64_t channels = 3, height = 32, width = 32;
  static constexpr int64_t record_bytes = 1 + channels * height * width;

  // The records of `files`, in order. Each file must hold a whole number of records
  // with labels in [0, 10); errors name the file.
  Cifar10(const std::vector<std::string>& files, std::string name);

  std::string name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape shape() const override { return {channels, height, width}; }
  int64_t num_classes() const override { return 10; }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

private:
  std::string name_;
  std::vector<uint8_t> pixels_;  // size() × 3072, already channel-major
  std::vector<uint8_t> labels_;
};

// The "train" or "test" split from the folder holding the .bin batches (gzipped or not).
std::shared_ptr<Dataset> cifar10(const std::string& folder, const std::string& split);

}  // namespace adjoint
