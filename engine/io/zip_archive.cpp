// The layout read here (APPNOTE 6.3, little-endian throughout):
//
//   local header + data, for each entry
//   central directory: one header per entry (name, method, CRC, sizes, local offset)
//   [zip64 end of central directory record + its locator]   when counts or offsets overflow
//   end of central directory record (22 bytes + a comment of up to 65535)
//
// The central directory is the archive's table of contents; the local headers are read
// only to find where each entry's data starts (their extra fields, which PyTorch uses to
// align data to 64 bytes, vary in length).
#include "engine/io/zip_archive.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "engine/error.h"
#include "engine/io/crc32.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEnd = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50, kZip64Locator = 0x07064b50;
constexpr size_t kEndBytes = 22, kCentralBytes = 46, kLocalBytes = 30, kZip64EndBytes = 56, kZip64LocatorBytes = 20;
// Deflate cannot expand data by more than this factor, so a larger claimed size is a lie
// (and would otherwise allocate without bound).
constexpr uint64_t kMaxDeflateRatio = 1032;

uint16_t u16(const unsigned char* p) { return uint16_t(p[0] | p[1] << 8); }
uint32_t u32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t u64(const unsigned char* p) { return uint64_t(u32(p)) | uint64_t(u32(p + 4)) << 32; }

// The CRC-32 of `bytes`, over the engine's threads: blocks of 1 MiB each get their own
// (crc32_update), which zlib then joins into the whole's (crc32_combine), in a fixed order.
uint32_t crc32_of(const unsigned char* bytes, size_t size) {
  constexpr size_t kBlock = size_t(1) << 20;
  const int64_t blocks = int64_t((size + kBlock - 1) / kBlock);
  if (blocks <= 1) return crc32_update(0, bytes, size);
  std::vector<uLong> crcs(static_cast<size_t>(blocks));
  parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const size_t at = size_t(b) * kBlock;
      crcs[size_t(b)] = crc32_update(0, bytes + at, std::min(kBlock, size - at));
    }
  });
  uLong crc = crcs[0];
  for (int64_t b = 1; b < blocks; ++b) {
    const size_t at = size_t(b) * kBlock;
    crc = crc32_combine(crc, crcs[size_t(b)], z_off_t(std::min(kBlock, size - at)));
  }
  return uint32_t(crc);
}

}  // namespace

bool ZipArchive::looks_like_zip(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char head[4] = {};
  const bool zip = ::pread(fd, head, 4, 0) == 4 && u32(head) == kLocalHeader;
  ::close(fd);
  return zip;
}

ZipArchive::~ZipArchive() = default;

ZipArchive::Mapping::~Mapping() {
  if (bytes != nullptr) ::munmap(const_cast<unsigned char*>(bytes), size);
}

void ZipArchive::check_within(uint64_t offset, uint64_t bytes, const std::string& what) const {
  if (offset > file_size_ || bytes > file_size_ - offset)
    throw Error(cat("zip archive ", path_, ": ", what, ": ", bytes, " bytes at offset ", offset,
                    " reach beyond the end of the file (", file_size_, " bytes; truncated?)"));
}

void ZipArchive::read_at(uint64_t offset, void* dst, size_t bytes, const std::string& what) const {
  check_within(offset, bytes, what);
  if (bytes > 0) std::memcpy(dst, mapping_.bytes + offset, bytes);
}

ZipArchive::ZipArchive(const std::string& path) : path_(path) {
  const std::string where = cat("zip archive ", path, ": ");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(cat(where, "cannot open: ", std::strerror(errno)));
  struct stat info {};
  const bool regular = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  file_size_ = regular ? uint64_t(info.st_size) : 0;
  void* mapped = regular && file_size_ > 0 ? ::mmap(nullptr, size_t(file_size_), PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const std::string why = mapped == MAP_FAILED ? std::strerror(errno) : "";
  ::close(fd);  // the mapping keeps the file
  if (!regular) throw Error(cat(where, "not a regular file"));
  if (mapped == MAP_FAILED) throw Error(cat(where, "cannot map it into memory: ", why));
  mapping_.bytes = static_cast<const unsigned char*>(mapped);
  mapping_.size = size_t(file_size_);

  // The end record: the last signature in the file's tail whose comment ends at the end.
  const size_t tail_bytes = size_t(std::min<uint64_t>(file_size_, kEndBytes + 65535));
  if (tail_bytes < kEndBytes)
    throw Error(cat(where, "file of ", file_size_, " bytes is too short for a zip archive's end record"));
  std::vector<unsigned char> tail(tail_bytes);
  const uint64_t tail_offset = file_size_ - tail_bytes;
  read_at(tail_offset, tail.data(), tail_bytes, "reading the end record");
  size_t end = std::string::npos;
  for (size_t i = tail_bytes - kEndBytes + 1; i-- > 0;)
    if (u32(&tail[i]) == kEnd && i + kEndBytes + u16(&tail[i + 20]) == tail_bytes) {
      end = i;
      break;
    }
  if (end == std::string::npos)
    throw Error(cat(where, "no end of central directory record (truncated, or not a zip archive)"));
  const unsigned char* record = &tail[end];
  if (u16(record + 4) != 0 || u16(record + 6) != 0) throw Error(cat(where, "spans several disks, which is not supported"));
  uint64_t count = u16(record + 10), directory_size = u32(record + 12), directory_offset = u32(record + 16);

  // zip64: the locator sits just before the end record and points at the zip64 end record.
  const uint64_t end_offset = tail_offset + end;
  if (end_offset >= kZip64LocatorBytes) {
    unsigned char locator[kZip64LocatorBytes];
    read_at(end_offset - kZip64LocatorBytes, locator, kZip64LocatorBytes, "reading the zip64 locator");
    if (u32(locator) == kZip64Locator) {
      unsigned char zip64[kZip64EndBytes];
      read_at(u64(locator + 8), zip64, kZip64EndBytes, "reading the zip64 end record");
      if (u32(zip64) != kZip64End) throw Error(cat(where, "the zip64 locator points at no zip64 end record"));
      count = u64(zip64 + 32), directory_size = u64(zip64 + 40), directory_offset = u64(zip64 + 48);
    }
  }
  if (directory_offset > file_size_ || directory_size > file_size_ - directory_offset)
    throw Error(cat(where, "central directory of ", directory_size, " bytes at offset ", directory_offset,
                    " lies beyond the file's ", file_size_, " bytes (truncated?)"));
  if (count > directory_size / kCentralBytes)
    throw Error(cat(where, "central directory of ", directory_size, " bytes cannot hold the ", count, " entries it claims"));

  std::vector<unsigned char> directory(directory_size);
  read_at(directory_offset, directory.data(), directory.size(), "reading the central directory");
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (directory.size() - at < kCentralBytes || u32(&directory[at]) != kCentralHeader)
      throw Error(cat(where, "central directory entry ", i, " of ", count, " is malformed"));
    const unsigned char* h = &directory[at];
    const size_t name_bytes = u16(h + 28), extra_bytes = u16(h + 30), comment_bytes = u16(h + 32);
    if (directory.size() - at - kCentralBytes < name_bytes + extra_bytes + comment_bytes)
      throw Error(cat(where, "central directory entry ", i, " of ", count, " runs past the directory"));
    Entry entry;
    entry.name.assign(reinterpret_cast<const char*>(h + kCentralBytes), name_bytes);
    if (u16(h + 8) & 1) throw Error(cat(where, "entry '", entry.name, "' is encrypted, which is not supported"));
    entry.method = u16(h + 10);
    entry.crc32 = u32(h + 16);
    entry.compressed_size = u32(h + 20);
    entry.size = u32(h + 24);
    entry.local_header_offset = u32(h + 42);
    // Fields that overflow 32 bits are 0xFFFFFFFF here and follow, in this order, in the
    // zip64 extra field (id 1).
    const unsigned char* extra = h + kCentralBytes + name_bytes;
    for (size_t e = 0; e + 4 <= extra_bytes;) {
      const uint16_t id = u16(extra + e), bytes = u16(extra + e + 2);
      if (e + 4 + bytes > extra_bytes) break;
      if (id == 1) {
        size_t field = e + 4;
        for (uint64_t* value : {&entry.size, &entry.compressed_size, &entry.local_header_offset}) {
          if (*value != 0xFFFFFFFFu) continue;
          if (field + 8 > e + 4 + bytes)
            throw Error(cat(where, "entry '", entry.name, "': its zip64 extra field is too short"));
          *value = u64(extra + field);
          field += 8;
        }
      }
      e += 4 + bytes;
    }
    entries_.push_back(std::move(entry));
    at += kCentralBytes + name_bytes + extra_bytes + comment_bytes;
  }
}

const ZipArchive::Entry* ZipArchive::find(const std::string& name) const {
  for (const Entry& entry : entries_)
    if (entry.name == name) return &entry;
  return nullptr;
}

ZipArchive::Content ZipArchive::content(const Entry& entry) const {
  const std::string what = cat("entry '", entry.name, "'");
  const std::string where = cat("zip archive ", path_, ": ", what, ": ");
  unsigned char local[kLocalBytes];
  read_at(entry.local_header_offset, local, kLocalBytes, what + ": reading its local header");
  if (u32(local) != kLocalHeader) throw Error(cat(where, "no local header at offset ", entry.local_header_offset));
  const uint64_t data_offset = entry.local_header_offset + kLocalBytes + u16(local + 26) + u16(local + 28);

  Content content;
  if (entry.method == 0) {
    if (entry.compressed_size != entry.size)
      throw Error(cat(where, "stored, yet its sizes differ (", entry.compressed_size, " and ", entry.size, " bytes)"));
    check_within(data_offset, entry.size, what);
    content.stored_ = mapping_.bytes + data_offset;
    content.size_ = size_t(entry.size);
  } else if (entry.method == 8) {
    if (entry.compressed_size > file_size_ || entry.size > entry.compressed_size * kMaxDeflateRatio + 64)
      throw Error(cat(where, "claims ", entry.size, " bytes from ", entry.compressed_size,
                      " compressed, which deflate cannot produce (corrupt or truncated)"));
    check_within(data_offset, entry.compressed_size, what);
    std::vector<unsigned char>& data = content.inflated_;
    data.resize(size_t(entry.size));
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw Error(cat(where, "zlib cannot start inflating"));
    stream.next_in = const_cast<unsigned char*>(mapping_.bytes + data_offset);
    stream.next_out = data.data();
    int status = Z_OK;
    // zlib counts in 32 bits; feed it at most 1 GiB at a time.
    constexpr size_t kChunk = size_t(1) << 30;
    size_t in_left = size_t(entry.compressed_size), out_left = data.size();
    while (status == Z_OK) {
      if (stream.avail_in == 0) stream.avail_in = uInt(std::min(in_left, kChunk)), in_left -= stream.avail_in;
      if (stream.avail_out == 0) stream.avail_out = uInt(std::min(out_left, kChunk)), out_left -= stream.avail_out;
      status = inflate(&stream, Z_NO_FLUSH);  // Z_BUF_ERROR: no progress possible (input ran out)
    }
    const uint64_t produced = stream.total_out;
    inflateEnd(&stream);
    if (status != Z_STREAM_END || produced != entry.size)
      throw Error(cat(where, "corrupt deflate data (", produced, " of ", entry.size, " bytes inflated)"));
    content.size_ = data.size();
  } else {
    throw Error(cat(where, "compression method ", entry.method, " is not supported (stored and deflate are)"));
  }
  if (crc32_of(content.data(), content.size()) != entry.crc32)
    throw Error(cat(where, "CRC-32 mismatch: the data is corrupt"));
  return content;
}

std::vector<unsigned char> ZipArchive::read(const Entry& entry) const {
  Content c = content(entry);
  if (!c.inflated_.empty()) return std::move(c.inflated_);
  return std::vector<unsigned char>(c.data(), c.data() + c.size());
}

}  // namespace adjoint
