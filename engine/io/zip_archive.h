// Reading a zip archive (PKWARE's APPNOTE): the container PyTorch's torch.save writes.
//
// Only what such archives use: one disk, entries stored or deflated, zip64 sizes and
// offsets, no encryption. Entries are read on demand from the open file, each checked
// against its CRC-32, so a file of weights larger than memory's spare room is never held
// twice.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace adjoint {

class ZipArchive {
public:
  struct Entry {
    std::string name;
    uint16_t method = 0;             // 0 stored, 8 deflated
    uint32_t crc32 = 0;
    uint64_t compressed_size = 0;
    uint64_t size = 0;               // uncompressed
    uint64_t local_header_offset = 0;
  };

  // Reads the central directory; throws Error naming `path` when the file is missing, is
  // not a zip archive, or its directory is truncated or inconsistent.
  explicit ZipArchive(const std::string& path);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  // True when the file starts with a zip local header (its first four bytes "PK\3\4").
  static bool looks_like_zip(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // The entry called `name`, or nullptr.
  const Entry* find(const std::string& name) const;
  // An entry's content, inflated when deflated; throws Error naming the archive and the
  // entry when its data is truncated, corrupt, or fails its CRC. Safe to call from several
  // threads at once (positioned reads).
  std::vector<unsigned char> read(const Entry& entry) const;

private:
  // Reads `bytes` at `offset`, naming `what` in the error.
  void read_at(uint64_t offset, void* dst, size_t bytes, const std::string& what) const;

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace adjoint
