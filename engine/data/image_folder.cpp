#include "engine/data/image_folder.h"

#include <stb/stb_image.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string_view>

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

// The names of the entries of `dir` that pass `keep`, sorted bytewise. Names are sorted
// as strings, not as paths: the order is the same (one folder's entries differ only in
// their last component) and an ImageNet class holds up to 1 300 of them.
template <class Keep>
std::vector<std::string> sorted_names(const fs::path& dir, Keep keep) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (keep(e)) out.push_back(e.path().filename().string());
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
  // A directory entry knows its own type on Linux, so this reads the folders and stats nothing.
  classes_ = sorted_names(root, [](const fs::directory_entry& e) { return e.is_directory(); });
  check(!classes_.empty(), root, ": no class sub-folders");
  for (size_t label = 0; label < classes_.size(); ++label) {
    const fs::path dir = fs::path(root) / classes_[label];
    const std::vector<std::string> images = sorted_names(
        dir, [](const fs::directory_entry& e) { return e.is_regular_file() && is_image_file(e.path()); });
    for (const std::string& image : images) {
      files_.push_back((dir / image).string());
      labels_.push_back(static_cast<int64_t>(label));
    }
  }
  check(!files_.empty(), root, ": no .png/.jpg/.jpeg/.bmp images in any class folder");
}

ImageFolder::ImageFolder(const std::string& root, const EvalPreset& preset)
    : ImageFolder(root, 3, preset.crop, preset.crop) {
  preset_ = &preset;
}

const std::string& ImageFolder::file(int64_t index) const {
  check_index(index);
  return files_[static_cast<size_t>(index)];
}

namespace {

uint32_t big_endian_32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// stb_image checks neither PNG's chunk CRCs nor the Adler-32 of its zlib stream, so a
// damaged file decodes to wrong pixels without a word. This walks the chunks, checks
// each CRC and inflates the image data to its end, which checks the Adler-32.
void check_png(const uint8_t* bytes, size_t size, const std::string& path) {
  std::vector<uint8_t> image_data;
  for (size_t at = 8;;) {
    check(size - at >= 12, path, ": damaged PNG: truncated at byte ", at, " before the IEND chunk");
    const uint32_t length = big_endian_32(bytes + at);
    check(length <= size - at - 12, path, ": damaged PNG: the chunk at byte ", at, " runs past the end of the file");
    const uint8_t* type = bytes + at + 4;  // the CRC covers the type and the data
    const std::string name(reinterpret_cast<const char*>(type), 4);
    check(crc32(0, type, length + 4) == big_endian_32(type + 4 + length), path, ": damaged PNG: chunk '", name,
          "' at byte ", at, " fails its CRC check");
    if (name == "IDAT") image_data.insert(image_data.end(), type + 4, type + 4 + length);
    if (name == "IEND") break;
    at += 12 + size_t(length);
  }
  z_stream stream{};
  check(inflateInit(&stream) == Z_OK, path, ": zlib: cannot start inflating");
  stream.next_in = image_data.data();
  stream.avail_in = static_cast<uInt>(image_data.size());
  std::vector<uint8_t> sink(size_t(1) << 16);  // the pixels are stb's business; only the checks count here
  int code = Z_OK;
  while (code == Z_OK) {
    stream.next_out = sink.data();
    stream.avail_out = static_cast<uInt>(sink.size());
    code = inflate(&stream, Z_NO_FLUSH);
  }
  const std::string why = stream.msg != nullptr ? stream.msg : "the data ends early";
  inflateEnd(&stream);
  check(code == Z_STREAM_END, path, ": damaged PNG: the image data fails zlib's checks (", why, ")");
}

// The formats told apart by their first bytes, so that an error names the format the
// file claims to be (stb reports the reason of whichever decoder it tried last).
struct ImageFormat {
  const char* name;
  std::string_view magic;
  void (*check)(const uint8_t*, size_t, const std::string&);  // extra integrity checks, or nullptr
};

const ImageFormat kImageFormats[] = {
    {"PNG", std::string_view("\x89PNG\r\n\x1a\n", 8), check_png},
    {"JPEG", "\xff\xd8\xff", nullptr},
    {"BMP", "BM", nullptr},
    {"GIF", "GIF8", nullptr},
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::error_code ec;
  check(fs::exists(path, ec), path, ": no such file");
  check(fs::is_regular_file(path, ec), path, ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path, ": cannot open (", std::strerror(errno), ")");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(!in.bad(), path, ": cannot read (", std::strerror(errno), ")");
  return bytes;
}

}  // namespace

DecodedImage decode_image_bytes(const uint8_t* bytes, size_t size, const std::string& path, int64_t channels) {
  const ImageFormat* format = nullptr;
  for (const ImageFormat& f : kImageFormats)
    if (std::string_view(reinterpret_cast<const char*>(bytes), size).starts_with(f.magic)) format = &f;
  const std::string what = format ? cat(format->name, " image") : std::string("image (not PNG, JPEG, BMP or GIF)");
  check(size > 0, path, ": empty file, not an image");
  check(size <= size_t(std::numeric_limits<int>::max()), path, ": ", size, " bytes is too large for an image");
  if (format && format->check) format->check(bytes, size, path);
  int w = 0, h = 0, n = 0;
  // A header may claim any size: 65 bytes of BMP can declare 111 million pixels, which
  // stb would allocate and decode (found by fuzz/fuzz_image.cpp). stbi_info reports a
  // top-down BMP's height as negative.
  constexpr int64_t max_pixels = int64_t(1) << 26;  // 64 megapixels, e.g. 8192 × 8192
  if (stbi_info_from_memory(bytes, static_cast<int>(size), &w, &h, &n) != 0)
    check(std::abs(int64_t(w) * int64_t(h)) <= max_pixels, path, ": ", what, " of ", w, " × ", std::abs(h),
          " pixels is over the limit of ", max_pixels, " pixels");
  // stb converts to the requested channel count; its failure reason is thread-local.
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes, static_cast<int>(size), &w, &h, &n, static_cast<int>(channels)), stbi_image_free);
  check(pixels != nullptr, path, ": cannot decode ", what, " (", stbi_failure_reason(), ")");
  DecodedImage image{h, w, channels, {}};
  image.pixels.assign(pixels.get(), pixels.get() + int64_t(w) * h * channels);
  return image;
}

DecodedImage load_image_bytes(const std::string& path, int64_t channels) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  return decode_image_bytes(bytes.data(), bytes.size(), path, channels);
}

void decode_image(const uint8_t* bytes, size_t size, const std::string& path, int64_t channels, int64_t height,
                  int64_t width, float* out) {
  const DecodedImage image = decode_image_bytes(bytes, size, path, channels);
  // Interleaved (H, W, C) bytes → planar (C, H, W) floats in [0, 1].
  const int64_t plane = image.width * image.height;
  const bool same_size = image.height == height && image.width == width;
  std::vector<float> scratch(same_size ? 0 : static_cast<size_t>(channels * plane));
  float* planar = same_size ? out : scratch.data();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < plane; ++i) planar[c * plane + i] = static_cast<float>(image.pixels[size_t(i * channels + c)]) / 255.0f;
  if (!same_size) resize_bilinear(planar, channels, image.height, image.width, out, height, width);
}

void load_image(const std::string& path, int64_t channels, int64_t height, int64_t width, float* out) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  decode_image(bytes.data(), bytes.size(), path, channels, height, width, out);
}

void ImageFolder::get(int64_t index, float* input, int64_t* targets) const {
  if (preset_ != nullptr) {
    const DecodedImage image = load_image_bytes(file(index), 3);
    preprocess_image(image.pixels.data(), image.height, image.width, *preset_, input, file(index));
  } else {
    load_image(file(index), channels_, height_, width_, input);
  }
  targets[0] = labels_[static_cast<size_t>(index)];
}

int64_t ImageFolder::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

}  // namespace adjoint
