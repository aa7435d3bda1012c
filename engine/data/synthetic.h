// Datasets built from nothing but a seed or a local text file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"

namespace adjoint {

// Modular addition: every ordered pair (a, b) in [0, P)², input the concatenation of
// one-hot(a) and one-hot(b) (length 2P), label (a + b) mod P. A seeded permutation of the
// P² pairs puts round(train_fraction·P²) of them in "train", the rest in "validation";
// "all" keeps every pair. Pairs are listed in increasing a·P + b order within a split.
class ModularAddition : public Dataset {
public:
  ModularAddition(int64_t modulus, const std::string& split = "all", double train_fraction = 0.3,
                  uint64_t seed = 0);
  std::string name() const override;
  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  Shape shape() const override { return {2 * modulus_}; }
  int64_t num_classes() const override { return modulus_; }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

  int64_t modulus() const { return modulus_; }
  // The pair of example `index`, as a·P + b.
  int64_t pair(int64_t index) const;

private:
  int64_t modulus_;
  std::string split_;
  std::vector<int64_t> pairs_;
};

// Byte-level language modelling over a text (any bytes). Example i is the window of
// `sequence_length` bytes starting at i·sequence_length, given as floats 0..255 (token
// ids for an embedding), and its targets are the next byte at each position (the input
// shifted by one). Windows do not overlap; the trailing bytes that do not fill one are
// dropped. 256 classes.
class TextCorpus : public Dataset {
public:
  TextCorpus(std::string bytes, int64_t sequence_length, std::string name);
  std::string name() const override { return name_; }
  int64_t size() const override;
  Shape shape() const override { return {sequence_length_}; }
  int64_t num_classes() const override { return 256; }
  int64_t target_length() const override { return sequence_length_; }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;

private:
  std::string bytes_;
  int64_t sequence_length_;
  std::string name_;
};

// The text of the file at `path` (gzipped or not) as a TextCorpus. split: "all", or
// "train" = the first (1 - validation_fraction) of the bytes, "validation" = the rest.
std::shared_ptr<Dataset> text_corpus(const std::string& path, int64_t sequence_length,
                                     const std::string& split = "all", double validation_fraction = 0.1);
// The same over several files, concatenated in the order given, as one text named `name`.
std::shared_ptr<Dataset> text_corpus(const std::vector<std::string>& paths, const std::string& name,
                                     int64_t sequence_length, const std::string& split, double validation_fraction);

}  // namespace adjoint
