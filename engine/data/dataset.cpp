#include "engine/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "engine/error.h"

namespace adjoint {

int64_t Dataset::get(int64_t index, float* input) const {
  check(target_length() == 1, name(), ": get(index, input) returns one label, but examples carry ",
        target_length(), " targets; call get(index, input, targets)");
  int64_t label = 0;
  get(index, input, &label);
  return label;
}

int64_t Dataset::label(int64_t index) const {
  std::vector<float> scratch(static_cast<size_t>(numel(shape())));
  return get(index, scratch.data());
}

void Dataset::check_index(int64_t index) const {
  check(index >= 0 && index < size(), name(), ": example ", index, " is out of range [0, ", size(), ")");
}

InMemoryDataset::InMemoryDataset(std::string name, Shape shape, std::vector<float> inputs,
                                 std::vector<int64_t> labels, int64_t num_classes)
    : name_(std::move(name)), shape_(std::move(shape)), inputs_(std::move(inputs)), labels_(std::move(labels)),
      num_classes_(num_classes) {
  check(inputs_.size() == labels_.size() * static_cast<size_t>(numel(shape_)), name_, ": ", inputs_.size(),
        " input values are not ", labels_.size(), " examples of shape ", shape_);
  for (int64_t label : labels_)
    check(label >= 0 && label < num_classes_, name_, ": label ", label, " is outside [0, ", num_classes_, ")");
}

void InMemoryDataset::get(int64_t index, float* input, int64_t* targets) const {
  check_index(index);
  const size_t per = static_cast<size_t>(numel(shape_));
  std::copy(inputs_.begin() + static_cast<std::ptrdiff_t>(index * per),
            inputs_.begin() + static_cast<std::ptrdiff_t>((index + 1) * per), input);
  targets[0] = labels_[static_cast<size_t>(index)];
}

int64_t InMemoryDataset::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

Subset::Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices, std::string name)
    : base_(std::move(base)), indices_(std::move(indices)), name_(std::move(name)) {
  check(base_ != nullptr, "Subset: no base dataset");
  if (name_.empty()) name_ = cat(base_->name(), "[subset of ", indices_.size(), "]");
  for (size_t i = 0; i < indices_.size(); ++i)
    check(indices_[i] >= 0 && indices_[i] < base_->size(), name_, ": index ", indices_[i], " at position ", i,
          " is out of range [0, ", base_->size(), ") of ", base_->name());
}

void Subset::get(int64_t index, float* input, int64_t* targets) const {
  check_index(index);
  base_->get(indices_[static_cast<size_t>(index)], input, targets);
}

int64_t Subset::label(int64_t index) const {
  check_index(index);
  return base_->label(indices_[static_cast<size_t>(index)]);
}

namespace {

// zlib's message, without the "path: " prefix it adds (our messages lead with the path).
std::string zlib_reason(gzFile file, const std::string& path, int& code) {
  std::string why = gzerror(file, &code);
  if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);
  return why;
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  check(!std::filesystem::is_directory(path, ec), path, ": is a directory, not a file");
  check(std::filesystem::is_regular_file(path, ec), path, ": no such file");
  gzFile file = gzopen(path.c_str(), "rb");
  check(file != nullptr, path, ": cannot open (", std::strerror(errno), ")");
  gzbuffer(file, 1 << 20);
  std::vector<uint8_t> bytes;
  // The uncompressed size is unknown for gzip; grow in large chunks.
  constexpr size_t chunk = size_t(1) << 22;
  for (;;) {
    const size_t have = bytes.size();
    bytes.resize(have + chunk);
    const int got = gzread(file, bytes.data() + have, static_cast<unsigned>(chunk));
    if (got < 0) {
      int code = 0;
      const std::string why = zlib_reason(file, path, code);
      gzclose(file);
      throw Error(cat(path, ": cannot read (", why, ")"));
    }
    bytes.resize(have + static_cast<size_t>(got));
    if (static_cast<size_t>(got) < chunk) break;
  }
  // A gzip stream cut short yields its bytes so far and reports the damage here only.
  int code = Z_OK;
  const std::string why = zlib_reason(file, path, code);
  gzclose(file);
  check(code == Z_OK, path, ": corrupt or truncated compressed data (", why, ")");
  return bytes;
}

std::string find_file_or_gz(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return path;
  if (std::filesystem::is_regular_file(path + ".gz", ec)) return path + ".gz";
  throw Error(cat(path, ": no such file (nor ", path, ".gz)"));
}

}  // namespace adjoint
