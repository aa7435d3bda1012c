#include "engine/data/idx.h"

#include <zlib.h>

#include <cstddef>

#include "engine/error.h"

namespace adjoint {

namespace {

constexpr uint8_t unsigned_byte_type = 0x08;

uint32_t read_big_endian(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

void put_big_endian(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// "train-images-idx3-ubyte" → the file in `folder`, gzipped or not.
std::string idx_file(const std::string& folder, const std::string& split, const char* kind) {
  check(split == "train" || split == "test", "IDX dataset in ", folder, ": unknown split '", split,
        "' (expected train or test)");
  const std::string prefix = split == "train" ? "train" : "t10k";
  return find_file_or_gz(cat(folder, "/", prefix, "-", kind, "-ubyte"));
}

std::shared_ptr<Dataset> idx_pair(const std::string& dataset, const std::string& split, const std::string& folder) {
  // Looked up in this order so that a missing folder is reported on the images file.
  const std::string images = idx_file(folder, split, "images-idx3");
  const std::string labels = idx_file(folder, split, "labels-idx1");
  return std::make_shared<IdxDataset>(images, labels, cat(dataset, "/", split));
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path);
  check(bytes.size() >= 4, path, ": truncated IDX file (", bytes.size(), " bytes, no header)");
  check(bytes[0] == 0 && bytes[1] == 0, path, ": not an IDX file (magic number starts with ", int(bytes[0]), ", ",
        int(bytes[1]), " instead of 0, 0)");
  check(bytes[2] == unsigned_byte_type, path, ": IDX type code 0x", std::hex, int(bytes[2]),
        " is not 0x08 (unsigned byte)");
  const int64_t rank = bytes[3];
  check(rank >= 1, path, ": IDX header declares 0 dimensions");
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  check(bytes.size() >= header, path, ": truncated IDX header (", rank, " dimensions need ", header, " bytes, file has ",
        bytes.size(), ")");
  IdxArray array;
  for (int64_t d = 0; d < rank; ++d) array.dims.push_back(read_big_endian(bytes.data() + 4 + 4 * d));
  const size_t found = bytes.size() - header;
  // Up to 255 extents of 32 bits each: their product can overflow, so it is only formed
  // while it stays within the bytes present (a zero extent makes it 0 whatever the rest).
  bool zero = false, beyond = false;
  size_t expected = 1;
  for (int64_t extent : array.dims) {
    zero = zero || extent == 0;
    if (extent != 0 && expected > found / static_cast<size_t>(extent)) beyond = true;
    else expected *= static_cast<size_t>(extent);
  }
  if (zero) {
    expected = 0;
    beyond = false;
  }
  check(!beyond, path, ": truncated IDX data (header ", array.dims, " needs more than the ", found,
        " bytes found)");
  check(found >= expected, path, ": truncated IDX data (header ", array.dims, " needs ", expected, " bytes, found ",
        found, ")");
  check(found == expected, path, ": ", found - expected, " unexpected bytes after the IDX data of shape ", array.dims);
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

void write_idx(const std::string& path, const IdxArray& array) {
  check(!array.dims.empty() && array.dims.size() < 256, "write_idx: ", path, ": bad rank ", array.dims.size());
  check(static_cast<int64_t>(array.data.size()) == numel(array.dims), "write_idx: ", path, ": ", array.data.size(),
        " bytes do not fill shape ", array.dims);
  std::vector<uint8_t> bytes = {0, 0, unsigned_byte_type, static_cast<uint8_t>(array.dims.size())};
  for (int64_t d : array.dims) put_big_endian(bytes, static_cast<uint32_t>(d));
  bytes.insert(bytes.end(), array.data.begin(), array.data.end());
  const bool gzipped = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  // zlib's "wbT" writes a plain file through the same interface.
  gzFile file = gzopen(path.c_str(), gzipped ? "wb" : "wbT");
  check(file != nullptr, "write_idx: cannot create ", path);
  const int wrote = gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(file);
  check(wrote == static_cast<int>(bytes.size()) && closed == Z_OK, "write_idx: cannot write ", path);
}

IdxDataset::IdxDataset(const std::string& images_path, const std::string& labels_path, std::string name,
                       int64_t num_classes)
    : name_(std::move(name)), num_classes_(num_classes) {
  check(num_classes > 0, name_, ": num_classes must be positive, got ", num_classes);
  IdxArray images = read_idx(images_path);
  check(images.dims.size() == 3, images_path, ": images must have 3 dimensions (count, rows, cols), header says ",
        images.dims);
  check(images.dims[1] > 0 && images.dims[2] > 0, images_path, ": empty image size ", images.dims);
  IdxArray labels = read_idx(labels_path);
  check(labels.dims.size() == 1, labels_path, ": labels must have 1 dimension (count), header says ", labels.dims);
  check(labels.dims[0] == images.dims[0], labels_path, ": ", labels.dims[0], " labels for ", images.dims[0],
        " images in ", images_path);
  for (size_t i = 0; i < labels.data.size(); ++i)
    check(labels.data[i] < num_classes, labels_path, ": label ", int(labels.data[i]), " of example ", i,
          " is not below the number of classes ", num_classes);
  count_ = images.dims[0], rows_ = images.dims[1], cols_ = images.dims[2];
  pixels_ = std::move(images.data);
  labels_ = std::move(labels.data);
}

void IdxDataset::get(int64_t index, float* input, int64_t* targets) const {
  check_index(index);
  const int64_t n = rows_ * cols_;
  const uint8_t* src = pixels_.data() + index * n;
  for (int64_t i = 0; i < n; ++i) input[i] = static_cast<float>(src[i]) / 255.0f;
  targets[0] = labels_[static_cast<size_t>(index)];
}

int64_t IdxDataset::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

std::shared_ptr<Dataset> fashion_mnist(const std::string& split, const std::string& folder) {
  return idx_pair("fashion-mnist", split, folder);
}

std::shared_ptr<Dataset> mnist(const std::string& split, const std::string& folder) {
  return idx_pair("mnist", split, folder);
}

}  // namespace adjoint
