// What the fuzz targets share: the loaders read files, so each input is written to a
// file in a folder private to the fuzzing process first. Errors (adjoint::Error) are the
// expected answer to a bad input; anything else (a crash, a sanitizer report, another
// exception escaping) is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace adjoint::fuzz {

// The folder, made once per process.
inline const std::string& folder() {
  static const std::string path = [] {
    const std::string p = std::filesystem::temp_directory_path().string() + "/adjoint-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(p);
    return p;
  }();
  return path;
}

// Writes the input to folder()/name and returns its path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = folder() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace adjoint::fuzz
