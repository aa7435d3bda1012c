// The safetensors format (https://github.com/huggingface/safetensors):
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object: "__metadata__" → {string: string} (optional), and for each
//              tensor name → {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//   [rest]     the data section; offsets are relative to its start, tensors row-major,
//              little-endian.
//
// The validation follows the reference implementation: the tensors, sorted by offset,
// must tile the data section exactly (no gap, no overlap, nothing after the last one),
// and each span must be exactly numel × element size bytes.
#include "engine/io/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"

namespace adjoint {

// Tensor bytes are read into and written from float storage as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// ---------------------------------------------------------------------------------------
// Element types and their conversion to float32.

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// bfloat16 is the upper half of a float32.
float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

using Converter = void (*)(const unsigned char* src, float* dst, size_t count);

// Element i of `src` as a T; memcpy because the data section need not be aligned.
template <class T>
T load(const unsigned char* src, size_t i) {
  T value;
  std::memcpy(&value, src + i * sizeof(T), sizeof(T));
  return value;
}

template <class T>
void convert_number(const unsigned char* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(load<T>(src, i));
}

void convert_f16(const unsigned char* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = half_to_float(load<uint16_t>(src, i));
}

void convert_bf16(const unsigned char* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = bfloat16_to_float(load<uint16_t>(src, i));
}

void convert_bool(const unsigned char* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = src[i] != 0 ? 1.0f : 0.0f;
}

struct Dtype {
  const char* name;
  int64_t size;         // bytes per element
  Converter convert;    // nullptr for F32, which is read straight into the tensor
  bool floating;        // a real number; else counts, ids, masks
};

constexpr Dtype kDtypes[] = {
    {"F32", 4, nullptr, true},
    {"F16", 2, convert_f16, true},
    {"BF16", 2, convert_bf16, true},
    {"F64", 8, convert_number<double>, true},
    {"I64", 8, convert_number<int64_t>, false},
    {"I32", 4, convert_number<int32_t>, false},
    {"I16", 2, convert_number<int16_t>, false},
    {"I8", 1, convert_number<int8_t>, false},
    {"U64", 8, convert_number<uint64_t>, false},
    {"U32", 4, convert_number<uint32_t>, false},
    {"U16", 2, convert_number<uint16_t>, false},
    {"U8", 1, convert_number<uint8_t>, false},
    {"BOOL", 1, convert_bool, false},
};

const Dtype* find_dtype(const std::string& name) {
  for (const Dtype& dtype : kDtypes)
    if (name == dtype.name) return &dtype;
  return nullptr;
}

std::string supported_dtypes() {
  std::string names;
  for (const Dtype& dtype : kDtypes) names += (names.empty() ? "" : ", ") + std::string(dtype.name);
  return names;
}

// ---------------------------------------------------------------------------------------
// Files.

struct CloseFile {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, CloseFile>;

// The reason of the last failed C library call, or of a short read at end of file.
std::string io_reason(std::FILE* file) {
  if (file != nullptr && std::feof(file) && !std::ferror(file)) return "unexpected end of file";
  return errno != 0 ? std::strerror(errno) : "I/O error";
}

void read_exactly(std::FILE* file, void* dst, size_t bytes, const std::string& what) {
  errno = 0;
  if (bytes > 0 && std::fread(dst, 1, bytes, file) != bytes) throw Error(cat(what, ": ", io_reason(file)));
}

// ---------------------------------------------------------------------------------------
// The header.

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  Shape shape;
  int64_t begin = 0, end = 0;  // byte offsets in the data section
};

int64_t non_negative_integer(const Json& value, const char* what) {
  if (!value.is_number()) throw Error(cat(what, " is a ", to_string(value.kind()), ", expected an integer"));
  const double x = value.as_number();
  if (x > 9007199254740992.0)
    throw Error(cat(what, " is ", to_json(value), ", too large (integers above 2^53 are not exact in JSON)"));
  if (std::trunc(x) != x || x < 0) throw Error(cat(what, " is ", to_json(value), ", expected a non-negative integer"));
  return static_cast<int64_t>(x);
}

const Json& member(const Json& info, const char* key) {
  const Json* value = info.find(key);
  if (value == nullptr) throw Error(cat("missing \"", key, "\""));
  return *value;
}

// One tensor's header entry; throws plain messages the caller prefixes with file and name.
Entry parse_entry(const std::string& name, const Json& info) {
  if (!info.is_object()) throw Error(cat("entry is a ", to_string(info.kind()), ", expected an object"));
  Entry entry;
  entry.name = name;

  const Json& dtype = member(info, "dtype");
  if (!dtype.is_string()) throw Error(cat("\"dtype\" is a ", to_string(dtype.kind()), ", expected a string"));
  entry.dtype = find_dtype(dtype.as_string());
  if (entry.dtype == nullptr)
    throw Error(cat("unknown dtype '", dtype.as_string(), "' (supported: ", supported_dtypes(), ")"));

  const Json& shape = member(info, "shape");
  if (!shape.is_array()) throw Error(cat("\"shape\" is a ", to_string(shape.kind()), ", expected an array"));
  for (const Json& extent : shape.as_array()) entry.shape.push_back(non_negative_integer(extent, "a \"shape\" extent"));

  const Json& offsets = member(info, "data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    throw Error(cat("\"data_offsets\" is ", to_json(offsets), ", expected [begin, end]"));
  entry.begin = non_negative_integer(offsets.as_array()[0], "\"data_offsets\" begin");
  entry.end = non_negative_integer(offsets.as_array()[1], "\"data_offsets\" end");
  return entry;
}

// numel × element size, or -1 when that overflows (it then cannot match any real span).
int64_t byte_size(const Entry& entry) {
  int64_t bytes = entry.dtype->size;
  for (int64_t extent : entry.shape)
    if (__builtin_mul_overflow(bytes, extent, &bytes)) return -1;
  return bytes;
}

std::string offsets_text(const Entry& entry) { return cat("data_offsets [", entry.begin, ", ", entry.end, "]"); }

// Checks that the entries, sorted by offset, tile [0, data_bytes) exactly.
void check_layout(std::vector<Entry>& entries, int64_t data_bytes, const std::string& where) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  int64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    const std::string at = cat(where, "tensor '", entry.name, "': ");
    if (entry.end < entry.begin) throw Error(cat(at, offsets_text(entry), " end before begin"));
    if (entry.begin < cursor)
      throw Error(cat(at, offsets_text(entry), " overlap tensor '", previous->name, "' (", offsets_text(*previous), ")"));
    if (entry.begin > cursor)
      throw Error(cat(at, offsets_text(entry), " leave a gap of ", entry.begin - cursor, " bytes after ",
                      previous ? cat("tensor '", previous->name, "'") : std::string("the start of the data section")));
    const int64_t expected = byte_size(entry);
    if (expected != entry.end - entry.begin)
      throw Error(cat(at, "dtype ", entry.dtype->name, " and shape ", entry.shape, " need ",
                      expected < 0 ? std::string("more than 2^63") : cat(expected), " bytes, ", offsets_text(entry),
                      " span ", entry.end - entry.begin));
    if (entry.end > data_bytes)
      throw Error(cat(at, offsets_text(entry), " reach beyond the data section of ", data_bytes,
                      " bytes (file truncated?)"));
    cursor = entry.end;
    previous = &entry;
  }
  if (cursor != data_bytes)
    throw Error(cat(where, data_bytes - cursor, " bytes after the last tensor ",
                    previous ? cat("'", previous->name, "'") : std::string("(there are none)"),
                    ": the data section is ", data_bytes, " bytes, the tensors cover ", cursor));
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string where = cat("read_safetensors: ", path, ": ");

  errno = 0;
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) throw Error(cat(where, "cannot open: ", std::strerror(errno)));
  // The size bounds every length and offset below; seeking also rejects directories.
  if (std::fseek(file.get(), 0, SEEK_END) != 0) throw Error(cat(where, "cannot seek: ", std::strerror(errno)));
  const long end_position = std::ftell(file.get());
  if (end_position < 0) throw Error(cat(where, "not a regular file"));
  const uint64_t file_bytes = static_cast<uint64_t>(end_position);
  std::rewind(file.get());

  if (file_bytes < 8)
    throw Error(cat(where, "file of ", file_bytes, " bytes is too short for the 8-byte header length"));
  uint64_t header_bytes = 0;
  read_exactly(file.get(), &header_bytes, 8, cat(where, "reading the header length"));
  if (header_bytes > kMaxHeaderBytes)
    throw Error(cat(where, "header length ", header_bytes, " is over the limit of ", kMaxHeaderBytes,
                    " bytes (not a safetensors file?)"));
  if (header_bytes > file_bytes - 8)
    throw Error(cat(where, "header length ", header_bytes, " exceeds the ", file_bytes - 8,
                    " bytes after the length field (truncated, or not a safetensors file)"));
  std::string header_text(header_bytes, '\0');
  read_exactly(file.get(), header_text.data(), header_bytes, cat(where, "reading the header"));

  Json header;
  try {
    header = parse_json(header_text);
  } catch (const Error& e) {
    throw Error(cat(where, "malformed JSON header: ", e.what()));
  }
  if (!header.is_object()) throw Error(cat(where, "header is a JSON ", to_string(header.kind()), ", expected an object"));

  SafetensorsFile result;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.as_object()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(cat(where, "__metadata__ is a ", to_string(info.kind()), ", expected an object"));
      for (const auto& [key, value] : info.as_object()) {
        if (!value.is_string())
          throw Error(cat(where, "__metadata__ value of '", key, "' is a ", to_string(value.kind()), ", expected a string"));
        result.metadata[key] = value.as_string();
      }
      continue;
    }
    try {
      entries.push_back(parse_entry(name, info));
    } catch (const Error& e) {
      throw Error(cat(where, "tensor '", name, "': ", e.what()));
    }
  }

  const int64_t data_bytes = static_cast<int64_t>(file_bytes - 8 - header_bytes);
  check_layout(entries, data_bytes, where);

  // Sorted by offset, the tensors lie back to back: one sequential pass reads them all,
  // float32 straight into tensor storage, other dtypes through a scratch buffer.
  std::vector<unsigned char> scratch;
  for (const Entry& entry : entries) {
    Tensor tensor = Tensor::empty(entry.shape);
    const size_t bytes = static_cast<size_t>(entry.end - entry.begin);
    const std::string what = cat(where, "tensor '", entry.name, "': reading ", bytes, " bytes");
    if (entry.dtype->convert == nullptr) {
      read_exactly(file.get(), tensor.data(), bytes, what);
    } else {
      scratch.resize(bytes);
      read_exactly(file.get(), scratch.data(), bytes, what);
      entry.dtype->convert(scratch.data(), tensor.data(), static_cast<size_t>(tensor.numel()));
    }
    result.tensors.emplace(entry.name, std::move(tensor));
    result.dtypes.emplace(entry.name, entry.dtype->name);
  }
  return result;
}

namespace {
// The header of a file of float32 tensors with these names and shapes, as write_safetensors
// lays it out: its 8-byte length, then the JSON (metadata first, then the tensors in key
// order, back to back in the data section), padded so that the data is 8-byte aligned. Each
// tensor's byte offset in the data section goes into `offsets`.
std::string safetensors_header(const std::string& where, const std::map<std::string, Shape>& shapes,
                               const std::map<std::string, std::string>& metadata,
                               std::map<std::string, int64_t>& offsets) {
  Json header = Json::object();
  Json::Object& members = header.as_object();
  if (!metadata.empty()) {
    Json::Object entries;
    for (const auto& [key, value] : metadata) entries.emplace_back(key, value);
    members.emplace_back("__metadata__", Json(std::move(entries)));
  }
  int64_t offset = 0;
  for (const auto& [name, shape] : shapes) {
    check(name != "__metadata__", where, "'__metadata__' is reserved and cannot name a tensor");
    Json extents = Json::array();
    for (int64_t extent : shape) extents.push_back(extent);
    const int64_t bytes = numel(shape) * static_cast<int64_t>(sizeof(float));
    Json info = Json::object();
    info.as_object() = {{"dtype", "F32"}, {"shape", std::move(extents)}, {"data_offsets", Json::Array{offset, offset + bytes}}};
    members.emplace_back(name, std::move(info));
    offsets[name] = offset;
    offset += bytes;
  }
  std::string header_text = to_json(header);
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  const uint64_t header_bytes = header_text.size();
  std::string out(reinterpret_cast<const char*>(&header_bytes), 8);
  return out + header_text;
}
}  // namespace

void write_safetensors(AtomicFile& file, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string where = cat("write_safetensors: ", file.path(), ": ");
  std::map<std::string, Shape> shapes;
  for (const auto& [name, tensor] : tensors) {
    check(tensor.defined(), where, "tensor '", name, "' is undefined");
    shapes[name] = tensor.shape();
  }
  std::map<std::string, int64_t> offsets;
  file.write(safetensors_header(where, shapes, metadata, offsets));
  for (const auto& [name, tensor] : tensors) {
    const Tensor dense = tensor.detach().contiguous();  // a copy only for strided views
    file.write(dense.data(), static_cast<size_t>(dense.numel()) * sizeof(float));
  }
}

SafetensorsWriter::SafetensorsWriter(std::string path, const std::map<std::string, Shape>& shapes,
                                     const std::map<std::string, std::string>& metadata)
    : file_(std::move(path), "write_safetensors") {
  const std::string where = cat("write_safetensors: ", file_.path(), ": ");
  std::map<std::string, int64_t> offsets;
  const std::string header = safetensors_header(where, shapes, metadata, offsets);
  for (const auto& [name, shape] : shapes)
    parts_[name] = {int64_t(header.size()) + offsets[name], numel(shape), 0};
  file_.write_at(0, header.data(), header.size());
}

void SafetensorsWriter::write(const std::string& name, int64_t first, const Tensor& values) {
  auto found = parts_.find(name);
  check(found != parts_.end(), "write_safetensors: ", file_.path(), ": no tensor '", name, "' in its header");
  Part& part = found->second;
  const Tensor dense = values.detach().contiguous();  // a copy only for strided views
  check(first >= 0 && first + dense.numel() <= part.elements, "write_safetensors: ", file_.path(), ": tensor '", name,
        "' has ", part.elements, " values, not [", first, ", ", first + dense.numel(), ")");
  const uint64_t offset = uint64_t(part.offset + first * int64_t(sizeof(float)));
  const size_t bytes = size_t(dense.numel()) * sizeof(float);
  file_.write_at(offset, dense.data(), bytes);
  file_.start_writeback(offset, bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  part.written += dense.numel();
}

void SafetensorsWriter::commit() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, part] : parts_)
      check(part.written == part.elements, "write_safetensors: ", file_.path(), ": tensor '", name, "' has ",
            part.written, " of its ", part.elements, " values written");
  }
  file_.commit();
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  AtomicFile file(path, "write_safetensors");
  write_safetensors(file, tensors, metadata);
  file.commit();
}

int64_t dtype_size(const std::string& dtype) {
  const Dtype* found = find_dtype(dtype);
  return found ? found->size : 0;
}

void convert_to_float(const std::string& dtype, const unsigned char* src, float* dst, size_t count) {
  const Dtype* found = find_dtype(dtype);
  check(found != nullptr, "convert_to_float: unknown dtype '", dtype, "' (supported: ", supported_dtypes(), ")");
  if (found->convert == nullptr) std::memcpy(dst, src, count * sizeof(float));
  else found->convert(src, dst, count);
}

void require_floating_point(const SafetensorsFile& file, const std::string& name, const std::string& path) {
  auto it = file.dtypes.find(name);
  if (it == file.dtypes.end()) return;  // built in memory, not read
  require_floating_point(it->second, name, path);
}

void require_floating_point(const std::string& dtype_name, const std::string& name, const std::string& path) {
  const Dtype* dtype = find_dtype(dtype_name);
  if (dtype == nullptr || !dtype->floating)
    throw Error(cat(path, ": tensor '", name, "' has dtype ", dtype_name,
                    ", expected floating point (F32, F16, BF16, F64); integer and boolean tensors are ids, counts "
                    "or masks, not weights or inputs"));
}

}  // namespace adjoint
