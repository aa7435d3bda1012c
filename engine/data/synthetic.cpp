#include "engine/data/synthetic.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "engine/random.h"

namespace adjoint {

ModularAddition::ModularAddition(int64_t modulus, const std::string& split, double train_fraction, uint64_t seed)
    : modulus_(modulus), split_(split) {
  // All P² pairs are indexed in memory and every input is 2P wide: 4096 is 16.8M pairs.
  constexpr int64_t max_modulus = 4096;
  check(modulus >= 2 && modulus <= max_modulus, "modular_addition: modulus must be between 2 and ", max_modulus,
        ", got ", modulus);
  check(train_fraction >= 0 && train_fraction <= 1, "modular_addition: train fraction ", train_fraction,
        " is outside [0, 1]");
  check(split == "train" || split == "validation" || split == "all", "modular_addition: unknown split '", split,
        "' (expected train, validation or all)");
  const int64_t total = modulus * modulus;
  if (split == "all") {
    pairs_.resize(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i) pairs_[static_cast<size_t>(i)] = i;
    return;
  }
  Generator gen(seed);
  const std::vector<int64_t> order = permutation(total, gen);
  const auto n_train = static_cast<std::ptrdiff_t>(std::llround(train_fraction * static_cast<double>(total)));
  if (split == "train") pairs_.assign(order.begin(), order.begin() + n_train);
  else pairs_.assign(order.begin() + n_train, order.end());
  std::sort(pairs_.begin(), pairs_.end());
}

std::string ModularAddition::name() const { return cat("modular-addition-", modulus_, "/", split_); }

int64_t ModularAddition::pair(int64_t index) const {
  check_index(index);
  return pairs_[static_cast<size_t>(index)];
}

void ModularAddition::get(int64_t index, float* input, int64_t* targets) const {
  const int64_t ab = pair(index), a = ab / modulus_, b = ab % modulus_;
  std::fill(input, input + 2 * modulus_, 0.0f);
  input[a] = 1.0f;
  input[modulus_ + b] = 1.0f;
  targets[0] = (a + b) % modulus_;
}

int64_t ModularAddition::label(int64_t index) const {
  const int64_t ab = pair(index);
  return (ab / modulus_ + ab % modulus_) % modulus_;
}

TextCorpus::TextCorpus(std::string bytes, int64_t sequence_length, std::string name)
    : bytes_(std::move(bytes)), sequence_length_(sequence_length), name_(std::move(name)) {
  check(sequence_length > 0, name_, ": sequence length must be positive, got ", sequence_length);
  check(size() > 0, name_, ": ", bytes_.size(), " bytes of text do not fill one sequence of ", sequence_length,
        " inputs plus its next-byte target");
}

int64_t TextCorpus::size() const {
  // Window i reads bytes [i·T, i·T + T]: T inputs and one more for the last target.
  const int64_t n = static_cast<int64_t>(bytes_.size());
  return n > 0 ? (n - 1) / sequence_length_ : 0;
}

void TextCorpus::get(int64_t index, float* input, int64_t* targets) const {
  check_index(index);
  const auto* text = reinterpret_cast<const unsigned char*>(bytes_.data()) + index * sequence_length_;
  for (int64_t t = 0; t < sequence_length_; ++t) {
    input[t] = static_cast<float>(text[t]);
    targets[t] = text[t + 1];
  }
}

std::shared_ptr<Dataset> text_corpus(const std::vector<std::string>& paths, const std::string& name,
                                     int64_t sequence_length, const std::string& split, double validation_fraction) {
  check(validation_fraction >= 0 && validation_fraction <= 1, "text_corpus: validation fraction ",
        validation_fraction, " is outside [0, 1]");
  std::vector<uint8_t> bytes;
  for (const std::string& path : paths) {
    const std::vector<uint8_t> file = read_file(path);
    bytes.insert(bytes.end(), file.begin(), file.end());
  }
  const auto cut = static_cast<size_t>(std::llround((1.0 - validation_fraction) * static_cast<double>(bytes.size())));
  std::string text;
  if (split == "all") text.assign(bytes.begin(), bytes.end());
  else if (split == "train") text.assign(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
  else if (split == "validation") text.assign(bytes.begin() + static_cast<std::ptrdiff_t>(cut), bytes.end());
  else throw Error(cat("text_corpus: ", name, ": unknown split '", split, "' (expected all, train or validation)"));
  return std::make_shared<TextCorpus>(std::move(text), sequence_length, cat(name, "/", split));
}

std::shared_ptr<Dataset> text_corpus(const std::string& path, int64_t sequence_length, const std::string& split,
                                     double validation_fraction) {
  return text_corpus(std::vector<std::string>{path}, cat("text:", path), sequence_length, split, validation_fraction);
}

}  // namespace adjoint
