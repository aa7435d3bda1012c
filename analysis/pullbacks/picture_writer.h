// Writing an explanation report's pictures while the report goes on: PNG compression is
// most of a picture's cost, and the report's methods leave a core idle for much of their
// time (their serial steps, the kernel zeroing fresh pages), so the pictures are encoded
// and written by a thread of their own as soon as they are drawn. Each picture is encoded
// exactly as write_png does alone, so the files are the same bytes whenever they are written.
// With one thread (--threads 1) there is no writer thread: finish() writes them all.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
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
  // Returns once every queued picture is on disk, the calling thread encoding beside the
  // writer's own; throws the first error of a picture (an Error naming its path).
  void finish();

private:
  // Takes the next queued picture, or returns false when none is left.
  bool take(std::pair<std::string, Image>& next);
  // Writes one picture, keeping its error for finish().
  void write_one(const std::pair<std::string, Image>& picture);
  void run();

  std::mutex mutex_;
  std::condition_variable queued_, idle_;
  std::deque<std::pair<std::string, Image>> pending_;
  int64_t writing_ = 0;  // pictures taken and not yet written
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace adjoint
