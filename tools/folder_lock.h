// An exclusive hold on the folder a command writes (its --out), so that two runs started
// into one folder cannot mix their files: the second refuses at once, in one line naming
// the process that holds the folder.
//
// The hold is an flock(2) on OUT/.lock: the kernel drops it when the holder exits, however
// it exits (kill -9 included), so a folder is never left locked by a run that is gone. The
// file keeps the holder's pid and command line for the message; it is a dot file, left out
// of the folder's report page.
//
//   const cli::FolderLock lock = cli::lock_output_folder(o.out_dir);  // before the first write
#pragma once
#include <memory>
#include <string>

namespace adjoint::cli {

class FolderLock {
 public:
  // Creates `dir` when missing and takes the lock; throws Error naming the folder and the
  // holder when another process holds it.
  explicit FolderLock(const std::string& dir);
  // Releases the lock. The lock file stays, but for a folder this lock created that holds
  // nothing else: the folder goes with it.
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  std::string dir_, path_;
  bool created_folder_ = false;
  int fd_ = -1;
};

// The lock of a command's output folder, taken by rank 0 alone under mpirun (the job's other
// ranks write under rank 0's hold); null on the other ranks.
std::unique_ptr<FolderLock> lock_output_folder(const std::string& dir);

}  // namespace adjoint::cli
