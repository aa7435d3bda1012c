#include "engine/files.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/error.h"

namespace adjoint {

namespace {
std::string reason() { return errno != 0 ? std::strerror(errno) : "I/O error"; }
}  // namespace

AtomicFile::AtomicFile(std::string path, std::string who)
    : path_(std::move(path)), temporary_(cat(path_, ".tmp.", ::getpid())), who_(std::move(who)) {
  errno = 0;
  file_ = std::fopen(temporary_.c_str(), "wb");
  if (file_ == nullptr) throw Error(cat(who_, ": ", path_, ": cannot create ", temporary_, ": ", reason()));
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(temporary_.c_str());
}

void AtomicFile::write(const void* bytes, size_t count) {
  check(file_ != nullptr, who_, ": ", path_, ": write after commit");
  errno = 0;
  if (count > 0 && std::fwrite(bytes, 1, count, file_) != count)
    throw Error(cat(who_, ": ", path_, ": writing ", temporary_, ": ", reason()));
}

void AtomicFile::commit() {
  errno = 0;
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    throw Error(cat(who_, ": ", path_, ": writing ", temporary_, ": ", reason()));
  errno = 0;
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) throw Error(cat(who_, ": ", path_, ": closing ", temporary_, ": ", reason()));
  errno = 0;
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0)
    throw Error(cat(who_, ": ", path_, ": renaming ", temporary_, " onto it: ", reason()));
  committed_ = true;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile file(path, "write");
  file.write(text);
  file.commit();
}

}  // namespace adjoint
