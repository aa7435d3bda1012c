// PyTorch weight files through the reader --weights uses (engine/io/state_dict_file.h):
// torch.save's zip archive and its restricted unpickler, told from safetensors by content.
//
// An input that starts as a zip archive does ("PK") is the file itself. Any other input is
// taken as the pickle: it is wrapped in a torch.save-shaped archive (data.pkl, four storages
// of 256 bytes, byteorder), with correct CRCs, so that mutations reach the unpickler and the
// gathering of tensors from storages instead of stopping at the archive's checksums.
#include <zlib.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/io/state_dict_file.h"
#include "fuzz/fuzz_input.h"

namespace {

void put16(std::string& out, uint32_t v) { out += char(v & 0xff), out += char(v >> 8 & 0xff); }
void put32(std::string& out, uint32_t v) { put16(out, v & 0xffff), put16(out, v >> 16); }

// A zip archive of stored entries.
std::string zip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const uint32_t crc = uint32_t(crc32_z(0, reinterpret_cast<const unsigned char*>(data.data()), data.size()));
    const uint32_t offset = uint32_t(out.size());
    for (std::string* header : {&out, &directory}) {
      const bool central = header == &directory;
      put32(*header, central ? 0x02014b50 : 0x04034b50);
      if (central) put16(*header, 20);
      put16(*header, 20), put16(*header, 0), put16(*header, 0), put16(*header, 0), put16(*header, 0);
      put32(*header, crc), put32(*header, uint32_t(data.size())), put32(*header, uint32_t(data.size()));
      put16(*header, uint32_t(name.size())), put16(*header, 0);
      if (central) put16(*header, 0), put16(*header, 0), put16(*header, 0), put32(*header, 0), put32(*header, offset);
      *header += name;
    }
    out += data;
  }
  const uint32_t directory_offset = uint32_t(out.size());
  out += directory;
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0), put16(out, uint32_t(entries.size())),
      put16(out, uint32_t(entries.size())), put32(out, uint32_t(directory.size())), put32(out, directory_offset),
      put16(out, 0);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string file(reinterpret_cast<const char*>(data), size);
  if (!file.starts_with("PK")) {
    std::vector<std::pair<std::string, std::string>> entries = {{"archive/data.pkl", file},
                                                                {"archive/byteorder", "little"}};
    for (int key = 0; key < 4; ++key)
      entries.emplace_back("archive/data/" + std::to_string(key), std::string(256, char(0x3f)));
    file = zip(entries);
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(file.data());
  const std::string path = adjoint::fuzz::write_input(bytes, file.size(), "input.pth");
  for (const char* key : {"", "model"}) {
    try {
      adjoint::read_state_dict(path, key);
    } catch (const adjoint::Error&) {
    }
  }
  return 0;
}
