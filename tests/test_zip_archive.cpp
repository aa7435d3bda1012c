// The zip reader under torch.save's files (engine/io/zip_archive.h), on archives written
// here: stored entries are used where they lie in the mapped file and deflated ones are
// inflated, each checked against its CRC-32, which is computed in blocks over the engine's
// threads for a large entry. A byte changed anywhere in an entry's data, in any block, must
// be caught, at any thread count.
#include <doctest/doctest.h>
#include <zlib.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/io/crc32.h"
#include "engine/io/zip_archive.h"
#include "engine/threads.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

void put16(std::string& out, uint32_t v) { out += char(v & 0xff), out += char(v >> 8 & 0xff); }
void put32(std::string& out, uint32_t v) { put16(out, v & 0xffff), put16(out, v >> 16); }

struct Written {
  std::string name, content;
  bool deflated = false;
};

// A zip archive of `entries` (APPNOTE's local headers, central directory and end record),
// a deflated entry compressed by zlib; returns the offset of each entry's data in `offsets`.
std::string zip(const std::vector<Written>& entries, std::vector<size_t>& offsets) {
  std::string out, directory;
  for (const Written& e : entries) {
    std::string data = e.content;
    if (e.deflated) {
      z_stream s{};
      REQUIRE(deflateInit2(&s, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
      data.resize(deflateBound(&s, uLong(e.content.size())));
      s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(e.content.data()));
      s.avail_in = uInt(e.content.size());
      s.next_out = reinterpret_cast<Bytef*>(data.data());
      s.avail_out = uInt(data.size());
      REQUIRE(deflate(&s, Z_FINISH) == Z_STREAM_END);
      data.resize(s.total_out);
      deflateEnd(&s);
    }
    const uint32_t crc = uint32_t(crc32_z(0, reinterpret_cast<const Bytef*>(e.content.data()), e.content.size()));
    const uint32_t at = uint32_t(out.size());
    for (std::string* header : {&out, &directory}) {
      const bool central = header == &directory;
      put32(*header, central ? 0x02014b50 : 0x04034b50);
      if (central) put16(*header, 20);
      put16(*header, 20), put16(*header, 0), put16(*header, e.deflated ? 8 : 0), put16(*header, 0), put16(*header, 0);
      put32(*header, crc), put32(*header, uint32_t(data.size())), put32(*header, uint32_t(e.content.size()));
      put16(*header, uint32_t(e.name.size())), put16(*header, 0);
      if (central) put16(*header, 0), put16(*header, 0), put16(*header, 0), put32(*header, 0), put32(*header, at);
      *header += e.name;
    }
    offsets.push_back(out.size());
    out += data;
  }
  const uint32_t directory_at = uint32_t(out.size());
  out += directory;
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0), put16(out, uint32_t(entries.size())),
      put16(out, uint32_t(entries.size())), put32(out, uint32_t(directory.size())), put32(out, directory_at), put16(out, 0);
  return out;
}

// `size` bytes of a seeded sequence.
std::string noise(size_t size, uint32_t seed) {
  std::string s(size, '\0');
  for (char& c : s) c = char((seed = seed * 1103515245u + 12345u) >> 24);
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("crc32_update: zlib's CRC-32 at every length, alignment and starting value, and continued at any split") {
  std::vector<unsigned char> bytes(3 << 20);
  uint32_t state = 12345;
  for (unsigned char& b : bytes) b = (state = state * 1664525u + 1013904223u) >> 24;
  CHECK(crc32_update(0, reinterpret_cast<const unsigned char*>("123456789"), 9) == 0xCBF43926u);  // the check value
  for (size_t size = 0; size <= 600; ++size)
    for (size_t offset = 0; offset < 4; ++offset)
      for (const uint32_t start : {0u, 0x9e3779b9u}) {
        CAPTURE(size);
        CAPTURE(offset);
        const unsigned char* p = bytes.data() + offset;
        REQUIRE(crc32_update(start, p, size) == uint32_t(crc32_z(start, p, size)));
      }
  const uint32_t whole = uint32_t(crc32_z(0, bytes.data(), bytes.size()));
  CHECK(crc32_update(0, bytes.data(), bytes.size()) == whole);
  for (const size_t split : {size_t(1), size_t(63), size_t(64), size_t(1000), size_t(1 << 20) + 7}) {
    CAPTURE(split);
    CHECK(crc32_update(crc32_update(0, bytes.data(), split), bytes.data() + split, bytes.size() - split) == whole);
  }
  bytes[bytes.size() / 2] ^= 0x10;  // one bit anywhere changes it
  CHECK(crc32_update(0, bytes.data(), bytes.size()) != whole);
}

TEST_CASE("zip archive: stored and deflated entries read back, a large one's CRC over blocks at 1 and 2 threads") {
  // 3 MiB and a few bytes: four blocks of the CRC, the last one short.
  const std::vector<Written> entries = {{"archive/data.pkl", noise(1000, 1), false},
                                        {"archive/data/0", noise((size_t(3) << 20) + 5, 2), false},
                                        {"archive/data/1", std::string(70000, 'x') + noise(50000, 3), true},
                                        {"archive/empty", "", false}};
  std::vector<size_t> offsets;
  const std::string bytes = zip(entries, offsets);
  TempDir dir;
  const std::string path = dir.file("a.zip");
  write_file(path, bytes);
  REQUIRE(ZipArchive::looks_like_zip(path));
  const int threads_before = num_threads();
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    const ZipArchive archive(path);
    REQUIRE(archive.entries().size() == entries.size());
    for (const Written& e : entries) {
      CAPTURE(e.name);
      const ZipArchive::Entry* entry = archive.find(e.name);
      REQUIRE(entry != nullptr);
      const ZipArchive::Content content = archive.content(*entry);
      CHECK(std::string(reinterpret_cast<const char*>(content.data()), content.size()) == e.content);
      const std::vector<unsigned char> copy = archive.read(*entry);
      CHECK(std::string(copy.begin(), copy.end()) == e.content);
    }
    // A stored entry is not copied: its content lies where the file's bytes do.
    const ZipArchive::Content big = archive.content(*archive.find("archive/data/0"));
    const ZipArchive::Content again = archive.content(*archive.find("archive/data/0"));
    CHECK(big.data() == again.data());
  }
  set_num_threads(threads_before);
}

TEST_CASE("zip archive: one byte changed in any block of an entry fails its CRC, naming the archive and the entry") {
  const std::vector<Written> entries = {{"archive/data/0", noise((size_t(3) << 20) + 5, 4), false},
                                        {"archive/data/1", noise(100000, 5), true}};
  std::vector<size_t> offsets;
  const std::string bytes = zip(entries, offsets);
  TempDir dir;
  const int threads_before = num_threads();
  // The first byte, one in the second and one in the last (short) block of the stored entry.
  for (const size_t within : {size_t(0), (size_t(1) << 20) + 17, (size_t(3) << 20) + 4}) {
    for (int threads : {1, 2}) {
      CAPTURE(within);
      CAPTURE(threads);
      set_num_threads(threads);
      std::string damaged = bytes;
      damaged[offsets[0] + within] ^= 0x10;
      const std::string path = dir.file("damaged.zip");
      write_file(path, damaged);
      const ZipArchive archive(path);
      const std::string message = "zip archive " + path + ": entry 'archive/data/0': CRC-32 mismatch";
      CHECK_THROWS_WITH_AS(archive.content(*archive.find("archive/data/0")), doctest::Contains(message.c_str()), Error);
      CHECK(archive.read(*archive.find("archive/data/1")).size() == 100000);  // the other entry is sound
    }
  }
  set_num_threads(threads_before);
  // Cut inside the stored entry's data: the directory is gone, so the archive says so.
  const std::string path = dir.file("cut.zip");
  write_file(path, bytes.substr(0, offsets[0] + 1000));
  CHECK_THROWS_WITH_AS(ZipArchive{path}, doctest::Contains("no end of central directory record"), Error);
}
