#include "analysis/pullbacks/picture_writer.h"

#include "engine/threads.h"

namespace adjoint {

PictureWriter::PictureWriter() {
  if (num_threads() > 1) thread_ = std::thread([this] { run(); });
}

PictureWriter::~PictureWriter() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  thread_.join();
}

void PictureWriter::write(std::string path, Image image) {
  write([path = std::move(path), image = std::move(image)] { write_png(path, image); });
}

void PictureWriter::write(std::function<void()> write_file) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(std::move(write_file));
  }
  queued_.notify_one();
}

bool PictureWriter::take(std::function<void()>& next) {
  if (pending_.empty()) return false;
  next = std::move(pending_.front());
  pending_.pop_front();
  ++writing_;
  return true;
}

void PictureWriter::write_one(const std::function<void()>& write_file) {
  std::exception_ptr failed;
  try {
    write_file();
  } catch (...) {
    failed = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed && !error_) error_ = failed;
  --writing_;
  if (pending_.empty() && writing_ == 0) idle_.notify_all();
}

void PictureWriter::run() {
  for (;;) {
    std::function<void()> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (!take(next)) return;  // stopping, nothing left
    }
    write_one(next);
  }
}

void PictureWriter::finish() {
  for (;;) {  // the caller encodes beside the writer's thread
    std::function<void()> next;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!take(next)) break;
    }
    write_one(next);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return pending_.empty() && writing_ == 0; });
  if (error_) {
    const std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

}  // namespace adjoint
