#include "engine/files.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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

int remove_stale_temporaries(const std::string& folder) {
  int removed = 0;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ignored)) {
    const std::string name = entry.path().filename().string();
    const size_t mark = name.rfind(".tmp.");
    if (mark == std::string::npos || mark == 0) continue;
    const std::string digits = name.substr(mark + 5);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // kill(pid, 0) sends nothing: it fails with ESRCH exactly when no such process exists.
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), ignored)) ++removed;
  }
  return removed;
}

}  // namespace adjoint
