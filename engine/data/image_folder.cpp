#include "engine/data/image_folder.h"

#include <stb/stb_image.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>

#include "engine/data/transform.h"
#include "engine/error.h"

namespace adjoint {

namespace fs = std::filesystem;

namespace {

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
}

// Sorted names of the entries of `dir` that pass `keep`.
template <class Keep>
std::vector<fs::path> sorted_entries(const fs::path& dir, Keep keep) {
  std::vector<fs::path> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (keep(e)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

ImageFolder::ImageFolder(const std::string& root, int64_t channels, int64_t height, int64_t width)
    : root_(root), channels_(channels), height_(height), width_(width) {
  check(channels == 1 || channels == 3 || channels == 4, name(), ": channels must be 1, 3 or 4, got ", channels);
  check(height > 0 && width > 0, name(), ": bad image size ", height, "x", width);
  std::error_code ec;
  check(fs::is_directory(root, ec), root, ": no such folder");
  const auto class_dirs = sorted_entries(root, [](const fs::directory_entry& e) { return e.is_directory(); });
  check(!class_dirs.empty(), root, ": no class sub-folders");
  for (const fs::path& dir : class_dirs) {
    const int64_t label = static_cast<int64_t>(classes_.size());
    classes_.push_back(dir.filename().string());
    const auto images = sorted_entries(
        dir, [](const fs::directory_entry& e) { return e.is_regular_file() && is_image_file(e.path()); });
    for (const fs::path& file : images) {
      int w = 0, h = 0, n = 0;
      check(stbi_info(file.c_str(), &w, &h, &n) != 0, file.string(), ": not a readable image (",
            stbi_failure_reason(), ")");
      files_.push_back(file.string());
      labels_.push_back(label);
    }
  }
  check(!files_.empty(), root, ": no .png/.jpg/.jpeg/.bmp images in any class folder");
}

const std::string& ImageFolder::file(int64_t index) const {
  check_index(index);
  return files_[static_cast<size_t>(index)];
}

void load_image(const std::string& path, int64_t channels, int64_t height, int64_t width, float* out) {
  int w = 0, h = 0, n = 0;
  // stb converts to the requested channel count; its failure reason is thread-local.
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(stbi_load(path.c_str(), &w, &h, &n, static_cast<int>(channels)),
                                                    stbi_image_free);
  check(pixels != nullptr, path, ": cannot decode image (", stbi_failure_reason(), ")");
  // Interleaved (H, W, C) bytes → planar (C, H, W) floats in [0, 1].
  const int64_t plane = int64_t(w) * h;
  const bool same_size = h == height && w == width;
  std::vector<float> scratch(same_size ? 0 : static_cast<size_t>(channels * plane));
  float* planar = same_size ? out : scratch.data();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < plane; ++i) planar[c * plane + i] = static_cast<float>(pixels.get()[i * channels + c]) / 255.0f;
  if (!same_size) resize_bilinear(planar, channels, h, w, out, height, width);
}

void ImageFolder::get(int64_t index, float* input, int64_t* targets) const {
  load_image(file(index), channels_, height_, width_, input);
  targets[0] = labels_[static_cast<size_t>(index)];
}

int64_t ImageFolder::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

}  // namespace adjoint
