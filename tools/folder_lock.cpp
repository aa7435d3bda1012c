#include "tools/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/distributed/ranks.h"
#include "engine/error.h"

namespace adjoint::cli {

namespace {

// This process's command line as it was started (argv joined by spaces).
std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string line, word;
  while (std::getline(in, word, '\0')) line += (line.empty() ? "" : " ") + word;
  return line.empty() ? std::string("unknown command") : line;
}

// What the holder wrote into the lock file: "pid N: COMMAND LINE" (empty when it has not yet).
std::string holder_of(int fd) {
  std::string text;
  char buffer[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, at);
    if (n <= 0) break;
    text.append(buffer, size_t(n));
    at += n;
    if (text.size() > 4096) break;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace

FolderLock::FolderLock(const std::string& dir) : dir_(dir), path_((std::filesystem::path(dir) / ".lock").string()) {
  std::error_code ec;
  created_folder_ = !std::filesystem::exists(dir, ec);
  // A run that gives the folder up removes the lock file; one that opened it just before
  // locks a file no longer in the folder, so it opens the folder's lock file again.
  for (;;) {
    std::filesystem::create_directories(dir, ec);
    check(!ec, "cannot create the output folder ", dir, ": ", ec.message());
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    check(fd_ >= 0, "cannot open ", path_, ": ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      const std::string holder = holder_of(fd_);
      ::close(fd_);
      fd_ = -1;
      check(error == EWOULDBLOCK, "cannot lock ", path_, ": ", std::strerror(error));
      throw Error(cat(dir, " is in use by another run (", holder.empty() ? std::string("a process starting") : holder,
                      "); wait for it to finish or give another --out"));
    }
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev)
      break;
    ::close(fd_);
    fd_ = -1;
  }
  const std::string holder = cat("pid ", ::getpid(), ": ", own_command_line(), "\n");
  // The text is only for the message above: a failure to write it does not release the hold.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
  }
}

FolderLock::~FolderLock() {
  // A run refused before it wrote anything (a bad option found late) leaves no folder behind
  // where there was none. The lock file goes while still held, so no other run holds it.
  std::error_code ec;
  if (created_folder_ && std::distance(std::filesystem::directory_iterator(dir_, ec), {}) == 1) {
    std::filesystem::remove(path_, ec);
    std::filesystem::remove(dir_, ec);
  }
  ::close(fd_);  // closing the last descriptor releases the flock
}

std::unique_ptr<FolderLock> lock_output_folder(const std::string& dir) {
  if (distributed::rank() != 0) return nullptr;
  return std::make_unique<FolderLock>(dir);
}

}  // namespace adjoint::cli
