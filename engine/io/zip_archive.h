// Reading a zip archive (PKWARE's APPNOTE): the container PyTorch's torch.save writes.
//
// Only what such archives use: one disk, entries stored or deflated, zip64 sizes and
// offsets, no encryption. The file is mapped into memory, not read: a stored entry (what
// torch.save writes) is used where it lies, checked against its CRC-32, so a file of
// weights is never copied whole, nor held twice in memory. The file must not shrink while
// the archive is open (reading a page cut off its end would end the process).
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
  // An entry's content: a stored entry's bytes where they lie in the mapped file, a
  // deflated one's inflated into memory of its own.
  class Content {
  public:
    const unsigned char* data() const { return inflated_.empty() ? stored_ : inflated_.data(); }
    size_t size() const { return size_; }

  private:
    friend class ZipArchive;
    const unsigned char* stored_ = nullptr;  // into the archive's mapping
    std::vector<unsigned char> inflated_;
    size_t size_ = 0;
  };
  // An entry's content, valid while the archive lives; throws Error naming the archive and
  // the entry when its data is truncated, corrupt, or fails its CRC (computed over the
  // engine's threads for a large entry). Safe to call from several threads at once.
  Content content(const Entry& entry) const;
  // The same, copied into a vector of its own.
  std::vector<unsigned char> read(const Entry& entry) const;

private:
  // Throws Error naming `what` unless `bytes` at `offset` lie inside the file.
  void check_within(uint64_t offset, uint64_t bytes, const std::string& what) const;
  // Copies `bytes` at `offset`, checked as check_within does.
  void read_at(uint64_t offset, void* dst, size_t bytes, const std::string& what) const;

  // The whole file, mapped read-only; unmapped with the archive, or when its constructor throws.
  struct Mapping {
    const unsigned char* bytes = nullptr;
    size_t size = 0;
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
  };

  std::string path_;
  Mapping mapping_;
  uint64_t file_size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace adjoint
