#include "engine/io/files.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>

#include "engine/error.h"

namespace adjoint {

namespace {
std::string reason() { return errno != 0 ? std::strerror(errno) : "I/O error"; }

// Ctrl-C (or a plain kill) while a file is being written would leave its temporary
// behind. The temporaries open at any moment are kept in a fixed table that a signal
// handler can read (it may only touch plain memory and call async-signal-safe functions
// such as unlink): each slot points at the path its AtomicFile holds, so that the table is
// small and large enough for every file a process's threads write at once. The handler
// removes them, then passes the signal on to whatever handled it before (by default: the
// process ends, killed by that signal).
constexpr int kSlots = 4096;
std::atomic<const char*> slot_paths[kSlots];
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction previous_actions[3];

extern "C" void remove_temporaries_and_pass_on(int signal_number) {
  for (int i = 0; i < kSlots; ++i)
    if (const char* path = slot_paths[i].load()) ::unlink(path);
  for (int k = 0; k < 3; ++k)
    if (kSignals[k] == signal_number) ::sigaction(signal_number, &previous_actions[k], nullptr);
  ::raise(signal_number);
}

// Installs the handler on each signal not already handled by it, remembering the action
// it replaces. A signal that is ignored (nohup) stays ignored.
void install_cleanup_handlers() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  for (int k = 0; k < 3; ++k) {
    struct sigaction current {};
    ::sigaction(kSignals[k], nullptr, &current);
    if (current.sa_handler == remove_temporaries_and_pass_on || current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = remove_temporaries_and_pass_on;
    sigemptyset(&action.sa_mask);
    previous_actions[k] = current;
    ::sigaction(kSignals[k], &action, nullptr);
  }
}

// The slot now pointing at `path` (which must outlive the registration), or -1 when the
// table is full (the file is then only cleaned up by the next remove_stale_temporaries).
int register_temporary(const std::string& path) {
  install_cleanup_handlers();
  for (int i = 0; i < kSlots; ++i) {
    const char* free_slot = nullptr;
    if (slot_paths[i].compare_exchange_strong(free_slot, path.c_str())) return i;
  }
  return -1;
}

void unregister_temporary(int slot) {
  if (slot >= 0) slot_paths[slot].store(nullptr);
}
}  // namespace

AtomicFile::AtomicFile(std::string path, std::string who)
    : path_(std::move(path)), temporary_(cat(path_, ".tmp.", ::getpid())), who_(std::move(who)) {
  // Registered before it exists, so that no signal finds it created but not yet known.
  slot_ = register_temporary(temporary_);
  errno = 0;
  file_ = std::fopen(temporary_.c_str(), "wb");
  if (file_ == nullptr) {
    const std::string why = reason();
    unregister_temporary(slot_);
    throw Error(cat(who_, ": ", path_, ": cannot create ", temporary_, ": ", why));
  }
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(temporary_.c_str());
  unregister_temporary(slot_);
}

void AtomicFile::write(const void* bytes, size_t count) {
  check(file_ != nullptr, who_, ": ", path_, ": write after commit");
  errno = 0;
  if (count > 0 && std::fwrite(bytes, 1, count, file_) != count)
    throw Error(cat(who_, ": ", path_, ": writing ", temporary_, ": ", reason()));
}

void AtomicFile::write_at(uint64_t offset, const void* bytes, size_t count) {
  check(file_ != nullptr, who_, ": ", path_, ": write after commit");
  errno = 0;
  if (std::fflush(file_) != 0) throw Error(cat(who_, ": ", path_, ": writing ", temporary_, ": ", reason()));
  const char* at = static_cast<const char*>(bytes);
  while (count > 0) {  // pwrite may write less than asked (a signal, a full disk's last block)
    errno = 0;
    const ssize_t written = ::pwrite(::fileno(file_), at, count, static_cast<off_t>(offset));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw Error(cat(who_, ": ", path_, ": writing ", temporary_, ": ", reason()));
    at += written;
    offset += static_cast<uint64_t>(written);
    count -= static_cast<size_t>(written);
  }
}

void AtomicFile::start_writeback(uint64_t offset, size_t count) {
  check(file_ != nullptr, who_, ": ", path_, ": write after commit");
  // Only a hint: where the file system cannot start the writes early, commit() makes them.
  ::sync_file_range(::fileno(file_), static_cast<off_t>(offset), static_cast<off_t>(count), SYNC_FILE_RANGE_WRITE);
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

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), "cannot read ", path);
  std::stringstream text;
  text << in.rdbuf();
  check(!in.bad(), "cannot read ", path);
  return text.str();
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
