// Writing files so that a reader sees the old file or the complete new one, never a
// half-written one: write beside the target, flush to disk, rename over it.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace adjoint {

// The temporary is removed when the writer fails (an exception), and also when the
// process is interrupted while writing (SIGINT, SIGTERM, SIGHUP: the signal then takes
// its course). Only kill -9 or a crash leaves it; remove_stale_temporaries cleans up.
class AtomicFile {
public:
  // Opens `<path>.tmp.<pid>`; `who` prefixes error messages ("write_safetensors").
  AtomicFile(std::string path, std::string who);
  ~AtomicFile();  // removes the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* bytes, size_t count);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Writes `count` bytes at byte `offset` of the temporary, wherever write() has got to: for
  // a file whose parts become known out of order. Threads may write disjoint ranges at once.
  void write_at(uint64_t offset, const void* bytes, size_t count);
  // Starts the disk writes of bytes [offset, offset + count) without waiting for them, so
  // that commit()'s sync finds little left to do when the parts were written early.
  void start_writeback(uint64_t offset, size_t count);
  // Flushes, syncs, closes and renames onto the target. Throws Error naming the path.
  void commit();
  const std::string& path() const { return path_; }

private:
  std::string path_, temporary_, who_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
  int slot_ = -1;  // in the table of temporaries removed on SIGINT, SIGTERM and SIGHUP
};

// The whole text in one atomic write.
void write_file_atomic(const std::string& path, const std::string& text);

// The whole text of a file. Throws Error naming the file when it cannot be read.
std::string read_text_file(const std::string& path);

// Removes the files `<name>.tmp.<pid>` in `folder` whose process is no longer running:
// what a writer killed mid-write (kill -9, a crash) leaves behind. Temporaries of live
// processes are kept, as they may be being written. Returns how many were removed.
int remove_stale_temporaries(const std::string& folder);

}  // namespace adjoint
