#include "engine/data/cifar.h"

#include "engine/error.h"

namespace adjoint {

Cifar10::Cifar10(const std::vector<std::string>& files, std::string name) : name_(std::move(name)) {
  check(!files.empty(), name_, ": no batch files given");
  constexpr int64_t image_bytes = record_bytes - 1;
  for (const std::string& path : files) {
    const std::vector<uint8_t> bytes = read_file(path);
    const int64_t size = static_cast<int64_t>(bytes.size());
    check(size > 0, path, ": empty CIFAR-10 batch file");
    check(size % record_bytes == 0, path, ": ", size, " bytes is not a whole number of ", record_bytes,
          "-byte CIFAR-10 records (truncated or not a CIFAR-10 binary batch; ", size % record_bytes,
          " bytes left over)");
    const int64_t count = size / record_bytes;
    for (int64_t r = 0; r < count; ++r) {
      const uint8_t* record = bytes.data() + r * record_bytes;
      check(record[0] < 10, path, ": label ", int(record[0]), " of record ", r,
            " is not a CIFAR-10 class (0-9); is this the CIFAR-100 format?");
      labels_.push_back(record[0]);
      pixels_.insert(pixels_.end(), record + 1, record + 1 + image_bytes);
    }
  }
}

void Cifar10::get(int64_t index, float* input, int64_t* targets) const {
  check_index(index);
  constexpr int64_t n = record_bytes - 1;
  const uint8_t* src = pixels_.data() + index * n;
  for (int64_t i = 0; i < n; ++i) input[i] = static_cast<float>(src[i]) / 255.0f;
  targets[0] = labels_[static_cast<size_t>(index)];
}

int64_t Cifar10::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

std::shared_ptr<Dataset> cifar10(const std::string& folder, const std::string& split) {
  std::vector<std::string> files;
  if (split == "train") {
    for (int b = 1; b <= 5; ++b) files.push_back(find_file_or_gz(cat(folder, "/data_batch_", b, ".bin")));
  } else if (split == "test") {
    files.push_back(find_file_or_gz(folder + "/test_batch.bin"));
  } else {
    throw Error(cat("cifar10 in ", folder, ": unknown split '", split, "' (expected train or test)"));
  }
  return std::make_shared<Cifar10>(files, cat("cifar10/", split));
}

}  // namespace adjoint
