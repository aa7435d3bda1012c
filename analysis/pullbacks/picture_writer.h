// Writing an explanation report's pictures while the report goes on: PNG compression is
// most of a picture's cost, and the report's methods leave a core idle for much of their
// time (their serial steps, the kernel zeroing fresh pages), so the pictures are encoded
// and written by a thread of their own as soon as they are drawn. Each picture is encoded
// exactly as write_png does alone, so the files are the same bytes whenever they are written.
// With one thread (--threads 1) there is no writer thread: finish() writes them all.
// The report's other files (its maps) are queued the same way, so that they are written
// while the report's caller does its last work (explain hands memory back meanwhile).
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "analysis/common/heatmap.h"

namespace adjoint {

class PictureWriter {
public:
  PictureWriter();
  // Waits for the pictures still queued; an error among them is dropped here (finish()
  // reports it), as a destructor must not throw.
  ~PictureWriter();
  PictureWriter(const PictureWriter&) = delete;
  PictureWriter& operator=(const PictureWriter&) = delete;

  // Queues `image` to be written to `path` (write_png); a failure shows at finish().
  void write(std::string path, Image image);
  // Queues the writing of any other file; a failure (an Error naming its path) shows at
  // finish(). What `write_file` uses must outlive the writer, whose thread may run it until
  // the writer is destroyed.
  void write(std::function<void()> write_file);
  // Returns once every queued file is on disk, the calling thread writing beside the
  // writer's own; throws the first error of a file (an Error naming its path).
  void finish();

private:
  // Takes the next queued file, or returns false when none is left.
  bool take(std::function<void()>& next);
  // Writes one file, keeping its error for finish().
  void write_one(const std::function<void()>& write_file);
  void run();

  std::mutex mutex_;
  std::condition_variable queued_, idle_;
  std::deque<std::function<void()>> pending_;
  int64_t writing_ = 0;  // files taken and not yet written
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace adjoint
