// MNIST-style IDX files (MNIST, Fashion-MNIST), gzipped or not.
//
// An IDX file is a big-endian header — two zero bytes, a type code (0x08 = unsigned
// byte, the only one these datasets use), the number of dimensions — then one 32-bit
// extent per dimension and the row-major data. Images are rank 3 (count, rows, cols),
// labels rank 1 (count).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"

namespace adjoint {

// The contents of one unsigned-byte IDX file.
struct IdxArray {
  Shape dims;
  std::vector<uint8_t> data;  // numel(dims) bytes, row-major
};

// Reads and validates an IDX file (magic number, type code, data length against the
// header). Errors name the file and what is wrong.
IdxArray read_idx(const std::string& path);
// Writes an unsigned-byte IDX file, gzipped when the path ends in ".gz" (tests, tools).
void write_idx(const std::string& path, const IdxArray& array);

// Images and labels from a pair of IDX files: examples are (1, rows, cols) in [0, 1].
class IdxDataset : public Dataset {
public:
  IdxDataset(const std::string& images_path, const std::string& labels_path, std::string name,
             int64_t num_classes = 10);
  std::string name() const override { return name_; }
  int64_t size() const override { return count_; }
  Shape shape() const override { return {1, rows_, cols_}; }
  int64_t num_classes() const override { return num_classes_; }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

private:
  std::string name_;
  int64_t count_ = 0, rows_ = 0, cols_ = 0, num_classes_ = 0;
  std::vector<uint8_t> pixels_;  // count × rows × cols, kept as bytes (4× smaller)
  std::vector<uint8_t> labels_;
};

// Debian's dataset-fashion-mnist installs here.
inline const char* const fashion_mnist_default_folder = "/usr/share/datasets/fashion-mnist";

// The "train" (60000) or "test" (10000) split from `folder`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each optionally with ".gz".
std::shared_ptr<Dataset> fashion_mnist(const std::string& split,
                                       const std::string& folder = fashion_mnist_default_folder);
// The same layout and file names for the original MNIST digits.
std::shared_ptr<Dataset> mnist(const std::string& split, const std::string& folder);

}  // namespace adjoint
